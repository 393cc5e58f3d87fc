//! `qXfer:threads:read`: the thread list as one XML document, as gdbserver serves it.
//!
//! GDB refreshes its thread list at every stop (`update_thread_list` in `normal_stop`). Without
//! this object it asks `qfThreadInfo` and then `qsThreadInfo` until the list ends — two round
//! trips per stop for a program with one thread; with it, one `qXfer` read (the document fits
//! in one reply). A reverse-stepi from GDB is a handful of round trips, so this is one of them
//! saved per step. gdbstub does not serve this object, so the router answers it.

use super::super::GdbStubAdapter;
use super::super::rsp::{parse_qxfer_read, qxfer_chunk};
use super::{Intercept, Router, RouterState};

/// The feature announced in the `qSupported` reply.
pub(super) const FEATURE: &str = "qXfer:threads:read+";

/// The thread list document: every thread of the target, the selected one first, with ids in
/// the form the rest of the session uses (`pPID.TID` in hex once GDB announced
/// `multiprocess+`, otherwise the bare TID).
pub(super) fn threads_document(pid: i32, tids: &[i32], multiprocess: bool) -> Vec<u8> {
    let mut doc = String::from("<?xml version=\"1.0\"?>\n<threads>\n");
    for &tid in tids {
        // The thread ids gdbstub reports (`adapter::thread_id`): at least 1.
        let tid = tid.max(1);
        if multiprocess {
            doc.push_str(&format!("<thread id=\"p{:x}.{tid:x}\"/>\n", pid.max(1)));
        } else {
            doc.push_str(&format!("<thread id=\"{tid:x}\"/>\n"));
        }
    }
    doc.push_str("</threads>\n");
    doc.into_bytes()
}

/// The reply to one `qXfer:threads:read::OFFSET,LENGTH` request. The document is built at
/// offset 0 and kept for the reads of its later chunks (as gdbserver does), so a list that
/// changes between two chunks cannot be served torn.
fn reply(
    session: &mut GdbStubAdapter,
    state: &RouterState,
    body: &[u8],
    kept: &mut Vec<u8>,
) -> Vec<u8> {
    let req = match parse_qxfer_read(body) {
        Ok(r) if r.object == b"threads" => r,
        _ => return b"E00".to_vec(),
    };
    if !req.annex.is_empty() {
        return b"E00".to_vec();
    }
    if req.offset == 0 {
        let multiprocess = state.client_features.iter().any(|f| f == "multiprocess+");
        let target = session.target();
        *kept = threads_document(target.pid(), &target.thread_ids(), multiprocess);
    }
    qxfer_chunk(kept, req.offset, req.length).unwrap_or_else(|_| b"E00".to_vec())
}

/// Registers the `qXfer:threads:read` object on `router`.
pub(super) fn register(router: &mut Router) {
    let mut kept = Vec::new();
    router.intercept(b"qXfer:threads:read:", move |session, state, body| {
        Intercept::Reply(reply(session, state, body, &mut kept))
    });
    router.add_qsupported_feature(FEATURE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_every_thread_selected_first() {
        let doc = threads_document(0x540a, &[0x540a, 0x540c], true);
        assert_eq!(
            String::from_utf8(doc).unwrap(),
            "<?xml version=\"1.0\"?>\n<threads>\n<thread id=\"p540a.540a\"/>\n\
             <thread id=\"p540a.540c\"/>\n</threads>\n"
        );
        let doc = threads_document(7, &[7], false);
        assert!(
            String::from_utf8(doc)
                .unwrap()
                .contains("<thread id=\"7\"/>")
        );
    }
}

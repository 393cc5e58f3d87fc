//! `monitor` commands (GDB `qRcmd`): a registry of named commands with one-line help.
//!
//! Later layers register their own commands (`history`, `goto`, `record on|off`, ...) with
//! [`MonitorRegistry::register`]; a handler gets the target and the argument text and returns
//! the text to show in GDB's console.

use crate::image::procfs::{maps_path, parse_maps_lenient};
use crate::target::Target;

/// The most of a maps file `monitor maps` reads (a process has at most 65 530 mappings by
/// default, ≈ 100 bytes a line).
const MAPS_LIMIT: usize = 16 << 20;

/// A monitor command handler: `(target, arguments) → output text or error text`.
pub type MonitorHandler = Box<dyn FnMut(&mut dyn Target, &str) -> Result<String, String>>;

struct MonitorCommand {
    name: String,
    help: String,
    handler: MonitorHandler,
}

/// The set of monitor commands a session answers.
pub struct MonitorRegistry {
    commands: Vec<MonitorCommand>,
}

impl std::fmt::Debug for MonitorRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.commands.iter().map(|c| &c.name))
            .finish()
    }
}

impl Default for MonitorRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl MonitorRegistry {
    /// An empty registry (`help` still works: it is answered by the registry itself).
    pub fn empty() -> Self {
        MonitorRegistry {
            commands: Vec::new(),
        }
    }

    /// The registry with the built-in commands `pid` and `maps` (and `help`).
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        r.register(
            "pid",
            "show the process id of the debugged program",
            |t, _| Ok(format!("{}\n", t.pid())),
        );
        r.register(
            "maps",
            "show the program's memory mappings (/proc/PID/maps)",
            |t, _| {
                // As the program sees them (the target's view of the file, which GDB's host
                // I/O reads too): a QEMU guest's mappings rather than QEMU's, a saved
                // recording's rather than whatever process has its pid now.
                let path = maps_path(t.pid());
                let text = t
                    .open_file(&path)
                    .and_then(|f| f.read_to_end(MAPS_LIMIT))
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let text = String::from_utf8_lossy(&text);
                let mut out = String::new();
                for m in parse_maps_lenient(&text) {
                    out.push_str(&format!(
                        "{:#014x}-{:#014x} {} {:#10x} {}\n",
                        m.start,
                        m.end,
                        m.perms(),
                        m.offset,
                        m.path.as_deref().unwrap_or("")
                    ));
                }
                Ok(out)
            },
        );
        r
    }

    /// Adds (or replaces) a command. `name` is one word; `help` one line.
    pub fn register(
        &mut self,
        name: &str,
        help: &str,
        handler: impl FnMut(&mut dyn Target, &str) -> Result<String, String> + 'static,
    ) {
        self.commands.retain(|c| c.name != name);
        self.commands.push(MonitorCommand {
            name: name.to_string(),
            help: help.to_string(),
            handler: Box::new(handler),
        });
    }

    /// The registered command names, in registration order (without `help`).
    pub fn names(&self) -> Vec<&str> {
        self.commands.iter().map(|c| c.name.as_str()).collect()
    }

    fn help_text(&self) -> String {
        let mut out = String::from("ptrewind monitor commands:\n");
        let width = self
            .commands
            .iter()
            .map(|c| c.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        out.push_str(&format!("  {:width$}  list the monitor commands\n", "help"));
        for c in &self.commands {
            out.push_str(&format!("  {:width$}  {}\n", c.name, c.help));
        }
        out
    }

    /// Runs a command line (`NAME ARGS...`). Returns the console text; unknown commands and
    /// handler errors produce an explanatory text rather than a failure, as gdbserver does.
    pub fn run(&mut self, target: &mut dyn Target, line: &str) -> String {
        let line = line.trim();
        let (name, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if name.is_empty() || name == "help" {
            return self.help_text();
        }
        match self.commands.iter_mut().find(|c| c.name == name) {
            Some(c) => match (c.handler)(target, args.trim()) {
                Ok(text) => text,
                Err(err) => format!("monitor {name}: {err}\n"),
            },
            None => format!("unknown monitor command '{name}'; try 'monitor help'\n"),
        }
    }
}

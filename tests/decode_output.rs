//! `ptrewind decode` output stays byte-identical: every output format of the CLI on every corpus
//! trace that has code images (and the HASE perf.data recordings, decoded through their MMAP
//! records) is compared with a digest of the output of the implementation before the output
//! path was rewritten for speed (main at 4fb5f8e, formatting through `write!`/`serde_json`).
//!
//! The digest is FNV-1a 64 over stdout plus its length, line count and the exit status. To
//! regenerate the table after an *intended* change of a format, run
//! `PTREWIND_GOLDEN_PRINT=1 cargo test --test decode_output -- --nocapture` and paste the lines.
//!
//! The HASE perf.data files are per-CPU recordings, decoded thread by thread since `decode`
//! splits them like `replay` (branch hwexec): their `json` digests changed then, and only by
//! the events' `offset`s, which are now offsets in the thread's stream (the same instructions,
//! events and times; checked with the outputs' offsets left out).
//!
//! The binary IP format (`ips-bin`) has no history; it is checked against the `ips` output of
//! the same run: the same addresses, in order, as little-endian u64, events left out.

mod support;

use std::ffi::OsString;
use std::process::Command;

const FORMATS: &[&str] = &["ips", "insn", "blocks", "calls", "json"];

/// (input, format, fnv64, bytes, lines, exit status) of the output before the rewrite.
const GOLDEN: &[(&str, &str, u64, usize, usize, i32)] = &[
    ("dynamorio/v1", "ips", 0x7ceb069ee6b9f87c, 141, 15, 0),
    ("dynamorio/v1", "insn", 0x3d1b5f2784c3fb73, 579, 15, 0),
    ("dynamorio/v1", "blocks", 0xc4ad7a51d5d5790b, 127, 9, 0),
    ("dynamorio/v1", "calls", 0x1810ee41fe196052, 85, 8, 0),
    ("dynamorio/v1", "json", 0xce323895c6b3d770, 1267, 15, 0),
    ("dynamorio/v2", "ips", 0x8be3b748886cf2f4, 533742, 59295, 0),
    (
        "dynamorio/v2",
        "insn",
        0xa8720578df88607d,
        4179346,
        59295,
        0,
    ),
    (
        "dynamorio/v2",
        "blocks",
        0x8ed77ebd53bc2fe5,
        431005,
        16595,
        0,
    ),
    ("dynamorio/v2", "calls", 0xc38f70fa79cf5635, 10459, 543, 0),
    (
        "dynamorio/v2",
        "json",
        0x85449f170bb68894,
        3900483,
        59295,
        0,
    ),
    ("dynamorio/v3", "ips", 0x72ea4172a56439d9, 129, 13, 0),
    ("dynamorio/v3", "insn", 0x02b3016d1ca7e5b2, 456, 13, 0),
    ("dynamorio/v3", "blocks", 0xcb8e98261a5570ef, 127, 9, 0),
    ("dynamorio/v3", "calls", 0x74c1c7919fdd2d0c, 87, 8, 0),
    ("dynamorio/v3", "json", 0x16f158067363fca3, 1162, 13, 0),
    ("dynamorio/v4", "ips", 0x9c55e32632ecf59d, 934845, 103855, 0),
    (
        "dynamorio/v4",
        "insn",
        0x7624484cc7063a22,
        7259460,
        103855,
        0,
    ),
    (
        "dynamorio/v4",
        "blocks",
        0x12c69f1c0e940474,
        707767,
        27214,
        0,
    ),
    ("dynamorio/v4", "calls", 0xb7b67ab729603cac, 91285, 3057, 0),
    (
        "dynamorio/v4",
        "json",
        0xa21caa4a90df3588,
        6832897,
        103855,
        0,
    ),
    ("dynamorio/v5", "ips", 0x06bdf59c5dd65d6b, 824172, 91558, 0),
    (
        "dynamorio/v5",
        "insn",
        0x5805f5ad29321be6,
        6381930,
        91558,
        0,
    ),
    (
        "dynamorio/v5",
        "blocks",
        0x8542121b82616464,
        603860,
        23213,
        0,
    ),
    ("dynamorio/v5", "calls", 0x95087b8ef39bab0e, 93473, 3144, 0),
    (
        "dynamorio/v5",
        "json",
        0xfd6773b16a75c9bc,
        6025360,
        91558,
        0,
    ),
    ("dynamorio/v6", "ips", 0x2b7fa248c1685c05, 533661, 59286, 0),
    (
        "dynamorio/v6",
        "insn",
        0x7b3dafa395434b12,
        4178902,
        59286,
        0,
    ),
    (
        "dynamorio/v6",
        "blocks",
        0x0c27fe1c18332eff,
        430978,
        16594,
        0,
    ),
    ("dynamorio/v6", "calls", 0x1371b35691323e18, 10455, 543, 0),
    (
        "dynamorio/v6",
        "json",
        0xdfbe0bda74fdb024,
        3899893,
        59286,
        0,
    ),
    ("hase/loopy-20180404", "ips", 0x2bd522607cef27c1, 687, 74, 0),
    (
        "hase/loopy-20180404",
        "insn",
        0x210dbf477c0ef255,
        3940,
        74,
        0,
    ),
    (
        "hase/loopy-20180404",
        "blocks",
        0xd522c5c4e0b47c30,
        637,
        34,
        0,
    ),
    (
        "hase/loopy-20180404",
        "calls",
        0x59f9fbabe6e7119c,
        245,
        23,
        0,
    ),
    (
        "hase/loopy-20180404",
        "json",
        0xa7b6cb0817d01828,
        5499,
        74,
        0,
    ),
    (
        "hase/control_flow-20180404",
        "ips",
        0x6ceb3d3172d853e6,
        10002,
        1109,
        0,
    ),
    (
        "hase/control_flow-20180404",
        "insn",
        0xcd147af430a29853,
        76982,
        1109,
        0,
    ),
    (
        "hase/control_flow-20180404",
        "blocks",
        0x5d3815ff3350f364,
        7658,
        304,
        0,
    ),
    (
        "hase/control_flow-20180404",
        "calls",
        0x5d8a8b411a84b42e,
        863,
        52,
        0,
    ),
    (
        "hase/control_flow-20180404",
        "json",
        0x5c43fef45b2e610c,
        73543,
        1109,
        0,
    ),
    ("hase/loopy-20180514", "ips", 0xe55ab008164c0a22, 741, 83, 0),
    (
        "hase/loopy-20180514",
        "insn",
        0xc49aab1652599a8e,
        3994,
        83,
        0,
    ),
    (
        "hase/loopy-20180514",
        "blocks",
        0x2aa369d0013a2d93,
        691,
        43,
        0,
    ),
    (
        "hase/loopy-20180514",
        "calls",
        0x59f9fbabe6e7119c,
        245,
        23,
        0,
    ),
    (
        "hase/loopy-20180514",
        "json",
        0xd2280b0d958122c3,
        6258,
        83,
        0,
    ),
    (
        "hase/control_flow-20180515",
        "ips",
        0xc33f9dabc355a724,
        8832,
        982,
        0,
    ),
    (
        "hase/control_flow-20180515",
        "insn",
        0x0152baed29f198b4,
        67181,
        982,
        0,
    ),
    (
        "hase/control_flow-20180515",
        "blocks",
        0x0c80af6ceec2f848,
        6569,
        269,
        0,
    ),
    (
        "hase/control_flow-20180515",
        "calls",
        0x56dc4607fa8426ec,
        863,
        52,
        0,
    ),
    (
        "hase/control_flow-20180515",
        "json",
        0x8e0ef838d257e036,
        63572,
        982,
        0,
    ),
    ("arcus/hello", "ips", 0x00e4c0b536175b0b, 2212890, 147556, 0),
    (
        "arcus/hello",
        "insn",
        0xdbc1ceb15b496060,
        10321496,
        147556,
        0,
    ),
    (
        "arcus/hello",
        "blocks",
        0x149d4ab904842cd5,
        1175635,
        30942,
        0,
    ),
    ("arcus/hello", "calls", 0x639c28f43ce1fdc0, 47667, 1560, 0),
    (
        "arcus/hello",
        "json",
        0x2f82be825424c60e,
        8384317,
        147556,
        0,
    ),
    (
        "arcus/last",
        "ips",
        0x76d7f7ff1d5087e5,
        28107534,
        1874099,
        0,
    ),
    (
        "arcus/last",
        "insn",
        0xa0463fd24f28afca,
        131073284,
        1874099,
        0,
    ),
    (
        "arcus/last",
        "blocks",
        0x5ba0fbdd7ffcea11,
        15565940,
        408267,
        0,
    ),
    ("arcus/last", "calls", 0x7c568e4899efa06b, 1946149, 58566, 0),
    (
        "arcus/last",
        "json",
        0x919de3ef1b8eea21,
        106515994,
        1874099,
        0,
    ),
    (
        "arcus/cve-2004-0597-poc",
        "ips",
        0xa19557b09d2074f5,
        7095585,
        473126,
        0,
    ),
    (
        "arcus/cve-2004-0597-poc",
        "insn",
        0x03dc9d2dfda6b3fd,
        32904239,
        473126,
        0,
    ),
    (
        "arcus/cve-2004-0597-poc",
        "blocks",
        0x02f7e38358686bb5,
        3452396,
        90681,
        0,
    ),
    (
        "arcus/cve-2004-0597-poc",
        "calls",
        0xcd908e4b8192c2ba,
        238309,
        7404,
        0,
    ),
    (
        "arcus/cve-2004-0597-poc",
        "json",
        0x6d296ac3325ad5a2,
        26893097,
        473126,
        0,
    ),
    (
        "arcus/cve-2005-0105-poc",
        "ips",
        0xbcb65759b6b33129,
        10069494,
        671365,
        0,
    ),
    (
        "arcus/cve-2005-0105-poc",
        "insn",
        0x2c557c08f108ff2c,
        46713432,
        671365,
        0,
    ),
    (
        "arcus/cve-2005-0105-poc",
        "blocks",
        0xbafd40efdc03b4e8,
        4860142,
        127516,
        0,
    ),
    (
        "arcus/cve-2005-0105-poc",
        "calls",
        0x3382fef0ad23a847,
        405466,
        12282,
        0,
    ),
    (
        "arcus/cve-2005-0105-poc",
        "json",
        0x30ccea5891242c04,
        38153981,
        671365,
        0,
    ),
    (
        "arcus/dp-01-poc",
        "ips",
        0x03a11a453cceafc2,
        2895759,
        193092,
        0,
    ),
    (
        "arcus/dp-01-poc",
        "insn",
        0x3846b044f529e8be,
        13518537,
        193092,
        0,
    ),
    (
        "arcus/dp-01-poc",
        "blocks",
        0x52591c537433dde0,
        1656337,
        43585,
        0,
    ),
    (
        "arcus/dp-01-poc",
        "calls",
        0x0faff13bea80f6db,
        70532,
        2346,
        0,
    ),
    (
        "arcus/dp-01-poc",
        "json",
        0xa49af8c3d7bf3130,
        10969394,
        193092,
        0,
    ),
    (
        "arcus/ovf-01-ben",
        "ips",
        0xa8c65795b1b8cffd,
        2643159,
        176246,
        0,
    ),
    (
        "arcus/ovf-01-ben",
        "insn",
        0xfc35251dd0c2da6f,
        12352452,
        176246,
        0,
    ),
    (
        "arcus/ovf-01-ben",
        "blocks",
        0x8330c2e7cff28240,
        1520957,
        40028,
        0,
    ),
    (
        "arcus/ovf-01-ben",
        "calls",
        0xbbe68bb9d32ecdf9,
        56088,
        1828,
        0,
    ),
    (
        "arcus/ovf-01-ben",
        "json",
        0x6083e878303539c7,
        10011488,
        176246,
        0,
    ),
    (
        "arcus/ovf-01-poc",
        "ips",
        0x5865b1f7614a81b3,
        1592052,
        106168,
        0,
    ),
    (
        "arcus/ovf-01-poc",
        "insn",
        0xe10c5038040102bd,
        7363405,
        106168,
        0,
    ),
    (
        "arcus/ovf-01-poc",
        "blocks",
        0x9c4ac02009431372,
        770215,
        20266,
        0,
    ),
    (
        "arcus/ovf-01-poc",
        "calls",
        0xf4bd63406cdba66f,
        49933,
        1656,
        0,
    ),
    (
        "arcus/ovf-01-poc",
        "json",
        0xffcf163860c09125,
        6036098,
        106168,
        0,
    ),
    (
        "arcus/ovf-02-ben",
        "ips",
        0x0e69d8d11ecb2bee,
        2654424,
        176997,
        0,
    ),
    (
        "arcus/ovf-02-ben",
        "insn",
        0xed810bbc910de7ba,
        12404341,
        176997,
        0,
    ),
    (
        "arcus/ovf-02-ben",
        "blocks",
        0x034940ced1f56c74,
        1528338,
        40221,
        0,
    ),
    (
        "arcus/ovf-02-ben",
        "calls",
        0x99cf7f5260c8165a,
        57072,
        1862,
        0,
    ),
    (
        "arcus/ovf-02-ben",
        "json",
        0x7df7df0ee65a2687,
        10054120,
        176997,
        0,
    ),
    (
        "arcus/ovf-02-poc",
        "ips",
        0x634be9b782adeee4,
        2630454,
        175399,
        0,
    ),
    (
        "arcus/ovf-02-poc",
        "insn",
        0x667e6b182ca8cc04,
        12291720,
        175399,
        0,
    ),
    (
        "arcus/ovf-02-poc",
        "blocks",
        0xd9e6e3bbcff2b265,
        1511969,
        39792,
        0,
    ),
    (
        "arcus/ovf-02-poc",
        "calls",
        0x26c8ca8e4aca561c,
        54784,
        1789,
        0,
    ),
    (
        "arcus/ovf-02-poc",
        "json",
        0xa23dc95351fa5f96,
        9963411,
        175399,
        0,
    ),
    (
        "arcus/ovf-03-ben",
        "ips",
        0xa17bb14352533604,
        2679174,
        178647,
        0,
    ),
    (
        "arcus/ovf-03-ben",
        "insn",
        0xfea2b2ab5cb08204,
        12519351,
        178647,
        0,
    ),
    (
        "arcus/ovf-03-ben",
        "blocks",
        0x6afc211e7e8a5409,
        1538497,
        40485,
        0,
    ),
    (
        "arcus/ovf-03-ben",
        "calls",
        0x14d586e73f66c75b,
        57490,
        1872,
        0,
    ),
    (
        "arcus/ovf-03-ben",
        "json",
        0xcc178c3792a095ff,
        10148050,
        178647,
        0,
    ),
    (
        "arcus/ovf-03-poc",
        "ips",
        0x7aa17d29e272d02a,
        1625988,
        108431,
        0,
    ),
    (
        "arcus/ovf-03-poc",
        "insn",
        0x8eaa9f4d62ae7e5b,
        7520833,
        108431,
        0,
    ),
    (
        "arcus/ovf-03-poc",
        "blocks",
        0xf385c00abe0de340,
        787693,
        20723,
        0,
    ),
    (
        "arcus/ovf-03-poc",
        "calls",
        0x203c91ff4a9b1385,
        51400,
        1703,
        0,
    ),
    (
        "arcus/ovf-03-poc",
        "json",
        0x22f7eebeadda1a46,
        6164883,
        108431,
        0,
    ),
    (
        "arcus/ovf-04-ben",
        "ips",
        0x91e031aee0fb5fbb,
        2643168,
        176246,
        0,
    ),
    (
        "arcus/ovf-04-ben",
        "insn",
        0x69d91f3f3821c349,
        12352946,
        176246,
        0,
    ),
    (
        "arcus/ovf-04-ben",
        "blocks",
        0x9e608b75acf57f53,
        1521201,
        40033,
        0,
    ),
    (
        "arcus/ovf-04-ben",
        "calls",
        0xeceda77f6c48f441,
        56033,
        1825,
        0,
    ),
    (
        "arcus/ovf-04-ben",
        "json",
        0xb7a7ccb2ee404a94,
        10011391,
        176246,
        0,
    ),
    (
        "arcus/ovf-04-poc",
        "ips",
        0x3db086a4cb2653fc,
        1592127,
        106173,
        0,
    ),
    (
        "arcus/ovf-04-poc",
        "insn",
        0x619908e3f1ca37f9,
        7364616,
        106173,
        0,
    ),
    (
        "arcus/ovf-04-poc",
        "blocks",
        0xdee7e5b4ca11c2e5,
        770824,
        20282,
        0,
    ),
    (
        "arcus/ovf-04-poc",
        "calls",
        0xbead8f2151117d8b,
        49929,
        1656,
        0,
    ),
    (
        "arcus/ovf-04-poc",
        "json",
        0xec2003a1e3f5270c,
        6036367,
        106173,
        0,
    ),
    (
        "arcus/uaf-01-poc",
        "ips",
        0xe67993f02e327bc2,
        2657874,
        177227,
        0,
    ),
    (
        "arcus/uaf-01-poc",
        "insn",
        0x2517f0b88b104669,
        12420965,
        177227,
        0,
    ),
    (
        "arcus/uaf-01-poc",
        "blocks",
        0x33e2a9c0a0e617d3,
        1529748,
        40258,
        0,
    ),
    (
        "arcus/uaf-01-poc",
        "calls",
        0xf0001cc3cb7ea1a5,
        55802,
        1856,
        0,
    ),
    (
        "arcus/uaf-01-poc",
        "json",
        0x7a60f7e30256ef02,
        10067209,
        177227,
        0,
    ),
    (
        "arcus/uaf-02-poc",
        "ips",
        0x7580e31b6fdc8bb6,
        2658099,
        177242,
        0,
    ),
    (
        "arcus/uaf-02-poc",
        "insn",
        0x479831df1b175750,
        12422069,
        177242,
        0,
    ),
    (
        "arcus/uaf-02-poc",
        "blocks",
        0x638d7323c6fcc63e,
        1529863,
        40261,
        0,
    ),
    (
        "arcus/uaf-02-poc",
        "calls",
        0xfa033b66934dbbc7,
        55798,
        1856,
        0,
    ),
    (
        "arcus/uaf-02-poc",
        "json",
        0x82f1b8a96627bdf8,
        10068058,
        177242,
        0,
    ),
    (
        "libxdc/Unzip",
        "ips",
        0x585a9a83ccc37491,
        1352498,
        150054,
        0,
    ),
    (
        "libxdc/Unzip",
        "insn",
        0x082361447f133d5b,
        10670096,
        150054,
        0,
    ),
    (
        "libxdc/Unzip",
        "blocks",
        0x5a02755bd4ee1ee7,
        1222824,
        47247,
        0,
    ),
    ("libxdc/Unzip", "calls", 0xa8d510a3d9e23b19, 53391, 705, 0),
    (
        "libxdc/Unzip",
        "json",
        0xfa0c2153afb7495e,
        7625365,
        150054,
        0,
    ),
    ("libxdc/foo", "ips", 0x82589990c8eecd5a, 1785045, 119422, 0),
    ("libxdc/foo", "insn", 0x27a5378b82bc386b, 8239264, 119422, 0),
    (
        "libxdc/foo",
        "blocks",
        0xa2c222cd6b55c828,
        1129239,
        30687,
        0,
    ),
    ("libxdc/foo", "calls", 0xd6902f4ebd8101ab, 784342, 6730, 0),
    ("libxdc/foo", "json", 0x11a118343163f9b3, 6843074, 119422, 0),
    (
        "libxdc/mruby",
        "ips",
        0xd1ee7d55ad431f57,
        57324370,
        6363758,
        0,
    ),
    (
        "libxdc/mruby",
        "insn",
        0x4d2c1dfe7f11f888,
        431855950,
        6363758,
        0,
    ),
    (
        "libxdc/mruby",
        "blocks",
        0xae487f0a853b2b8e,
        12801719,
        500553,
        0,
    ),
    (
        "libxdc/mruby",
        "calls",
        0xfb03cead703e7844,
        13265987,
        119475,
        0,
    ),
    (
        "libxdc/mruby",
        "json",
        0x45557780d2e409b7,
        325561786,
        6363758,
        0,
    ),
    (
        "libxdc/qemu",
        "ips",
        0x743e9c227476097c,
        145620253,
        9712470,
        0,
    ),
    (
        "libxdc/qemu",
        "insn",
        0xb5434381cd39fb8f,
        668990815,
        9712470,
        0,
    ),
    (
        "libxdc/qemu",
        "blocks",
        0x185743f447f4aeda,
        77218940,
        2076127,
        0,
    ),
    (
        "libxdc/qemu",
        "calls",
        0x3d4ff0bfa5a98ed7,
        26797815,
        211362,
        0,
    ),
    (
        "libxdc/qemu",
        "json",
        0xeb7386ef664e85b0,
        554431067,
        9712470,
        0,
    ),
    (
        "libxdc/avscript_32",
        "ips",
        0xe7cf11da1f215c2e,
        12258664,
        1114352,
        0,
    ),
    (
        "libxdc/avscript_32",
        "insn",
        0xbb82ead2bfcfd2ce,
        75713853,
        1114352,
        0,
    ),
    (
        "libxdc/avscript_32",
        "blocks",
        0xa8239301c08d979f,
        9505324,
        316467,
        0,
    ),
    (
        "libxdc/avscript_32",
        "calls",
        0x23d85d80bbb03842,
        517986,
        14531,
        0,
    ),
    (
        "libxdc/avscript_32",
        "json",
        0x74b5669bab281a1e,
        58755995,
        1114352,
        0,
    ),
    ("libxdc/dyn_test", "ips", 0x5de83febc7a9d947, 22111, 1418, 2),
    (
        "libxdc/dyn_test",
        "insn",
        0x84acc75127a0ecc5,
        69643,
        1418,
        2,
    ),
    (
        "libxdc/dyn_test",
        "blocks",
        0x3b74104c429edbf8,
        16258,
        735,
        2,
    ),
    ("libxdc/dyn_test", "calls", 0xadd7b0e4a15764a0, 2946, 152, 2),
    (
        "libxdc/dyn_test",
        "json",
        0x420beb096f5c63dd,
        96912,
        1418,
        2,
    ),
    ("libxdc/icelake_tip", "ips", 0xf97bb4f48e78cda0, 397, 24, 0),
    (
        "libxdc/icelake_tip",
        "insn",
        0x6160d631fb4ebf51,
        1205,
        24,
        0,
    ),
    (
        "libxdc/icelake_tip",
        "blocks",
        0x1f56a17241b4f213,
        343,
        14,
        0,
    ),
    ("libxdc/icelake_tip", "calls", 0x0b28beb1dd1061c7, 84, 7, 0),
    (
        "libxdc/icelake_tip",
        "json",
        0xcf11e7ce3074a7a5,
        1794,
        24,
        0,
    ),
    ("perf/loopy-20180404", "ips", 0x2bd522607cef27c1, 687, 74, 0),
    (
        "perf/loopy-20180404",
        "insn",
        0xed1092c7e863bdb3,
        3940,
        74,
        0,
    ),
    (
        "perf/loopy-20180404",
        "blocks",
        0xd522c5c4e0b47c30,
        637,
        34,
        0,
    ),
    (
        "perf/loopy-20180404",
        "calls",
        0x5957297f3d23043f,
        224,
        23,
        0,
    ),
    (
        "perf/loopy-20180404",
        "json",
        0x6d236ed1fd7864cd,
        5495,
        74,
        0,
    ),
    (
        "perf/control_flow-20180404",
        "ips",
        0x6ceb3d3172d853e6,
        10002,
        1109,
        0,
    ),
    (
        "perf/control_flow-20180404",
        "insn",
        0x7a6ad2690747c2b2,
        76982,
        1109,
        0,
    ),
    (
        "perf/control_flow-20180404",
        "blocks",
        0x5d3815ff3350f364,
        7658,
        304,
        0,
    ),
    (
        "perf/control_flow-20180404",
        "calls",
        0xf6e504c7c65ccb07,
        972,
        52,
        0,
    ),
    (
        "perf/control_flow-20180404",
        "json",
        0xc8462fc5a4f09ae2,
        73540,
        1109,
        0,
    ),
];

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn ptrewind(args: &[OsString]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptrewind"))
        .arg("decode")
        .args(args)
        .output()
        .expect("run ptrewind")
}

/// The inputs: (name, decode arguments without --format). Corpus traces with images as --pt and
/// --raw files, and the HASE perf.data recordings with --search-dir.
fn inputs(dir: &std::path::Path) -> Vec<(String, Vec<OsString>)> {
    let Some(root) = support::require_corpus("decode_output") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in support::corpus::trace_names(&root) {
        let t = support::corpus::load_trace(&root, &name).expect("corpus trace");
        if !t.has_images() {
            continue;
        }
        let sub = dir.join(name.replace('/', "_"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        let files = support::corpus::write_cli_inputs(&t, &sub).expect("write inputs");
        out.push((name, files.decode_args()));
    }
    let hase = root.join("hase-pt-recordings");
    for (sub, file) in [
        ("loopy-20180404", "loopy-20180404T162955.perf"),
        ("control_flow-20180404", "control_flow-20180404T163033.perf"),
    ] {
        out.push((
            format!("perf/{sub}"),
            vec![
                "--perf".into(),
                hase.join(sub).join(file).into(),
                "--search-dir".into(),
                hase.join(sub).into(),
            ],
        ));
    }
    out
}

#[test]
fn decode_formats_match_golden_digests() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let inputs = inputs(tmp.path());
    if inputs.is_empty() {
        return;
    }
    let print = std::env::var("PTREWIND_GOLDEN_PRINT").as_deref() == Ok("1");
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, args) in &inputs {
        for format in FORMATS {
            let mut a = args.clone();
            a.push("--format".into());
            a.push((*format).into());
            let out = ptrewind(&a);
            let status = out.status.code().unwrap_or(-1);
            let got = (
                fnv64(&out.stdout),
                out.stdout.len(),
                out.stdout.iter().filter(|&&b| b == b'\n').count(),
                status,
            );
            if print {
                if status != 0 {
                    eprintln!("{name} {format}: {}", String::from_utf8_lossy(&out.stderr));
                }
                println!(
                    "    (\"{name}\", \"{format}\", {:#018x}, {}, {}, {}),",
                    got.0, got.1, got.2, got.3
                );
                continue;
            }
            let want = GOLDEN
                .iter()
                .find(|g| g.0 == name && g.1 == *format)
                .map(|g| (g.2, g.3, g.4, g.5));
            match want {
                Some(w) if w == got => checked += 1,
                Some(w) => failures.push(format!(
                    "{name} --format {format}: got {got:x?}, want {w:x?}; stderr {}",
                    String::from_utf8_lossy(&out.stderr)
                )),
                None => failures.push(format!("{name} --format {format}: no golden entry")),
            }
        }
    }
    if print {
        return;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, GOLDEN.len(), "golden entries without an input");
}

/// `--format ips-bin` carries exactly the addresses of `--format ips`.
#[test]
fn ips_bin_matches_ips() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (name, args) in inputs(tmp.path()) {
        let run = |format: &str| {
            let mut a = args.clone();
            a.push("--format".into());
            a.push(format.into());
            ptrewind(&a)
        };
        let text = run("ips");
        let bin = run("ips-bin");
        assert_eq!(text.status.code(), bin.status.code(), "{name}");
        let want: Vec<u64> = String::from_utf8(text.stdout)
            .expect("utf-8")
            .lines()
            .filter(|l| !l.starts_with('['))
            .map(|l| u64::from_str_radix(l.trim_start_matches("0x"), 16).expect("hex ip"))
            .collect();
        assert_eq!(bin.stdout.len() % 8, 0, "{name}");
        let got: Vec<u64> = bin
            .stdout
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(got == want, "{name}: ips-bin differs from ips");
    }
}

//! Generates the libfabric bindings (bindgen, from the installed headers,
//! the provider headers `rdma/providers/fi_prov.h` and `fi_log.h`
//! included) and checks that the headers are a version this crate was
//! written for: the provider fills libfabric's structs field by field, and
//! a struct that changed would be filled wrong.

use std::path::PathBuf;

/// The libfabric API versions (major, minor) whose headers this crate
/// was checked against. A new minor version may add fields to the structs
/// the provider fills (`fi_info` attributes, ops tables): read its
/// `fabric.h`, `fi_domain.h`, `fi_endpoint.h`, `fi_eq.h` and
/// `providers/fi_prov.h` changes before adding it here.
const SUPPORTED: &[(u32, u32)] = &[(1, 17)];

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    // Never unloaded: libfabric's destructor dlcloses providers at exit
    // while an FI_PROGRESS_AUTO domain's progress thread (which nothing
    // stops when the application exits without closing it) still runs
    // the provider's code; unmapping it under that thread crashed the
    // process. With nodelete, dlclose leaves the code mapped until exit.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let lib = pkg_config::Config::new().atleast_version("1.17").probe("libfabric").unwrap_or_else(|e| {
        panic!(
            "\n\nshmfab-fi needs libfabric's headers and library (libfabric-dev) and pkg-config: \
             run scripts/deps.sh\n({e})\n"
        )
    });
    let mut incs = lib.include_paths.clone();
    incs.push(PathBuf::from("/usr/include"));
    let fabric_h =
        incs.iter().map(|d| d.join("rdma/fabric.h")).find(|p| p.exists()).unwrap_or_else(|| {
            panic!("\n\nno rdma/fabric.h under {incs:?}: install libfabric-dev (scripts/deps.sh)\n")
        });
    println!("cargo:rerun-if-changed={}", fabric_h.display());
    let text = std::fs::read_to_string(&fabric_h).expect("read rdma/fabric.h");
    let define = |name: &str| -> u32 {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("#define "))
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next().and_then(|v| v.parse().ok())).flatten()
            })
            .unwrap_or_else(|| panic!("\n\n{} does not define {name} as a number\n", fabric_h.display()))
    };
    let (major, minor) = (define("FI_MAJOR_VERSION"), define("FI_MINOR_VERSION"));
    if !SUPPORTED.contains(&(major, minor)) {
        panic!(
            "\n\nshmfab-fi supports libfabric API {:?} (major, minor), but {} is {major}.{minor}.\n\
             The provider fills libfabric's structs itself: check the header changes of \
             {major}.{minor} (fi_info attributes, ops tables, fi_prov.h) and add it to \
             SUPPORTED in fi/build.rs.\n",
            SUPPORTED,
            fabric_h.display()
        );
    }
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*")
        .allowlist_function("fi_log.*|fi_param.*|fi_dupinfo|fi_freeinfo|fi_strerror|fi_tostr")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .parse_callbacks(Box::new(Widths));
    for d in &lib.include_paths {
        b = b.clang_arg(format!("-I{}", d.display()));
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    b.generate()
        .unwrap_or_else(|e| {
            panic!(
                "\n\nbindgen failed on libfabric's headers ({e}): it needs libclang (libclang-dev, scripts/deps.sh)\n"
            )
        })
        .write_to_file(&out)
        .expect("write bindings");
}

/// Integer types of the header's `#define`s: fabric errnos (`FI_E*`
/// below `FI_ERRNO_OFFSET`'s range, all under 512) are `i32`, as the
/// calls return them negated; every other `FI_*` value (flags, caps,
/// modes, versions) is `u64`, the type of the fields it goes in. Left to
/// bindgen, a small flag such as `FI_MSG` would be `u32` and a large one
/// `u64`.
#[derive(Debug)]
struct Widths;

impl bindgen::callbacks::ParseCallbacks for Widths {
    fn int_macro(&self, name: &str, value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if !name.starts_with("FI_") {
            return None;
        }
        Some(if name.starts_with("FI_E") && (0..512).contains(&value) { IntKind::I32 } else { IntKind::U64 })
    }
}

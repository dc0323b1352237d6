//! Tests of library discovery: versions from file names and wheels, search order, messages.
use super::*;

#[test]
fn version_from_versioned_file_name() {
    let dir = std::env::temp_dir().join(format!("gpukit-vtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let real = dir.join("libcublas.so.13.1.0.3");
    std::fs::write(&real, b"x").unwrap();
    let link = dir.join("libcublas.so.13");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert_eq!(version_from_file(&link).as_deref(), Some("13.1.0.3"));
    let bare = dir.join("libnccl.so.2");
    std::fs::write(&bare, b"x").unwrap();
    assert_eq!(version_from_file(&bare), None);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wheel_versions_come_from_dist_info() {
    let site = std::env::temp_dir().join(format!("gpukit-site-{}", std::process::id()));
    let lib_dir = site.join("nvidia/cudnn/lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::create_dir_all(site.join("nvidia_cudnn_cu13-9.13.0.50.dist-info")).unwrap();
    std::fs::create_dir_all(site.join("nvidia_cublasmp_cu13-0.5.1.dist-info")).unwrap();
    std::fs::create_dir_all(site.join("nvidia_cublas-13.0.2.14.dist-info")).unwrap();
    let lib = lib_dir.join("libcudnn.so.9");
    std::fs::write(&lib, b"x").unwrap();
    let mut w = WheelVersions::default();
    assert_eq!(
        w.version_for(Lib::Cudnn, &lib).as_deref(),
        Some("9.13.0.50")
    );
    assert_eq!(
        w.version_for(Lib::Cublas, &lib).as_deref(),
        Some("13.0.2.14")
    );
    assert_eq!(w.version_for(Lib::Nccl, &lib), None);
    assert_eq!(w.version_for(Lib::Cuda, &lib), None);
    std::fs::remove_dir_all(&site).unwrap();
}

#[test]
fn finds_a_library_in_a_user_root_before_others() {
    let a = std::env::temp_dir().join(format!("gpukit-root-a-{}", std::process::id()));
    let b = std::env::temp_dir().join(format!("gpukit-root-b-{}", std::process::id()));
    for d in [&a, &b] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("libnccl.so.2"), b"x").unwrap();
    }
    let other = if CUDA_MAJOR == 13 { 12 } else { 13 };
    std::fs::write(b.join(format!("libcublas.so.{other}")), b"x").unwrap();
    let roots = vec![
        (a.clone(), Source::GpukitCudaPath),
        (b.clone(), Source::PythonWheels),
    ];
    let mut w = WheelVersions::default();
    let nccl = find_library(Lib::Nccl, &roots, &[], &mut w);
    let f = nccl.found.unwrap();
    assert_eq!(f.path, a.join("libnccl.so.2"));
    assert_eq!(f.source, Source::GpukitCudaPath);
    assert_eq!(nccl.shadowed, vec![b.join("libnccl.so.2")]);
    let cublas = find_library(Lib::Cublas, &roots, &[], &mut w);
    assert!(cublas.found.is_none());
    assert_eq!(
        cublas.other_major,
        Some(b.join(format!("libcublas.so.{other}")))
    );
    for d in [&a, &b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn extra_libraries_are_found_by_name_where_discovery_searched() {
    let base = std::env::temp_dir().join(format!("gpukit-extra-{}", std::process::id()));
    let user = base.join("user");
    let site = base.join("site-packages");
    let system = base.join("system");
    for d in [&user, &site.join("tensorrt_libs"), &system] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(user.join("libnvinfer_plugin.so.10"), b"x").unwrap();
    std::fs::write(user.join("libnvinfer.so.10"), b"x").unwrap();
    std::fs::write(user.join("libnvinfer.so"), b"x").unwrap();
    std::fs::write(site.join("tensorrt_libs/libnvinfer.so.10"), b"x").unwrap();
    std::fs::write(system.join("libnvinfer.so.8"), b"x").unwrap();
    // as GPUKIT_CUDA_PATH=user would have it: the user's directory first, versioned first
    let searched = vec![
        (user.clone(), Source::GpukitCudaPath),
        (system.clone(), Source::SystemDir),
    ];
    let dirs = extra_dirs_from(&searched, std::slice::from_ref(&site));
    assert_eq!(
        dirs,
        vec![
            user.clone(),
            user.join("tensorrt_libs"),
            user.join("tensorrt"),
            site.join("tensorrt_libs"),
            site.join("tensorrt"),
            system.clone(),
        ]
    );
    assert_eq!(
        find_library_file(&dirs, "nvinfer"),
        Some(user.join("libnvinfer.so.10"))
    );
    // pip's wheel before the system's copy
    assert_eq!(
        find_library_file(&dirs[1..], "nvinfer"),
        Some(site.join("tensorrt_libs/libnvinfer.so.10"))
    );
    assert_eq!(find_library_file(&dirs, "nvonnxparser"), None);
    // a site-packages given as GPUKIT_CUDA_PATH
    let dirs = extra_dirs_from(&[(site.clone(), Source::GpukitCudaPath)], &[]);
    assert_eq!(
        find_library_file(&dirs, "nvinfer"),
        Some(site.join("tensorrt_libs/libnvinfer.so.10"))
    );
    // through a Discovery: its searched directories come first
    let d = Discovery {
        libraries: vec![],
        warnings: vec![],
        searched,
        added_to_loader_path: vec![],
        alias_dir: None,
    };
    assert_eq!(
        find_extra_library(&d, "nvinfer"),
        Some(user.join("libnvinfer.so.10"))
    );
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn library_names_match_the_stem_only() {
    let plain = "libnvinfer.so";
    for yes in ["libnvinfer.so", "libnvinfer.so.10", "libnvinfer.so.10.3.0"] {
        assert!(is_library_name(yes, plain), "{yes}");
    }
    for no in ["libnvinfer_plugin.so.10", "libnvinfer.so10", "libnvinfer.a"] {
        assert!(!is_library_name(no, plain), "{no}");
    }
}

#[test]
fn missing_message_names_what_to_install() {
    let d = Discovery {
        libraries: vec![LibraryStatus {
            lib: Lib::Cudnn,
            soname: Lib::Cudnn.soname(),
            found: None,
            other_major: None,
            shadowed: vec![],
            disabled: false,
        }],
        warnings: vec![],
        searched: vec![],
        added_to_loader_path: vec![],
        alias_dir: None,
    };
    assert!(!d.usable(Lib::Cudnn));
    let m = d.missing_message(Lib::Cudnn);
    assert!(m.contains("libcudnn.so.9"), "{m}");
    assert!(m.contains("pip install nvidia-cudnn-cu"), "{m}");
}

#[test]
fn a_disabled_library_is_absent_and_says_why() {
    let d = Discovery {
        libraries: vec![LibraryStatus {
            lib: Lib::Cupti,
            soname: Lib::Cupti.soname(),
            found: None,
            other_major: None,
            shadowed: vec![PathBuf::from("/opt/x/libcupti.so.13")],
            disabled: true,
        }],
        warnings: vec![],
        searched: vec![],
        added_to_loader_path: vec![],
        alias_dir: None,
    };
    assert!(!d.usable(Lib::Cupti));
    let m = d.missing_message(Lib::Cupti);
    assert!(m.contains("GPUKIT_DISABLE") && m.contains("cupti"), "{m}");
    assert!(!m.contains("install"), "{m}");
}

#[test]
fn the_environment_gpukit_is_installed_in_is_searched() {
    let base = std::env::temp_dir().join(format!("gpukit-ownenv-{}", std::process::id()));
    // as `pip install gpukit` lays out a virtual environment beside PyTorch's CUDA wheels
    let venv = base.join("venv");
    let site = venv.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::create_dir_all(site.join("nvidia/cudnn/lib")).unwrap();
    std::fs::create_dir_all(site.join("nvidia/cublas/lib")).unwrap();
    std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
    std::fs::create_dir_all(site.join("nvidia/not-a-wheel")).unwrap();
    let exe = venv.join("bin/gpukit");
    std::fs::write(&exe, b"x").unwrap();
    assert_eq!(installed_site_packages(&exe), vec![site.clone()]);
    assert_eq!(
        wheel_lib_dirs(&site),
        vec![
            site.join("nvidia/cudnn/lib"),
            site.join("nvidia/cublas/lib"),
            site.join("nvidia/cu13/lib"),
        ]
    );
    // a binary outside a `bin` directory (cargo's target/release/), or whose prefix has no
    // site-packages (`cargo install`'s ~/.cargo/bin/), adds nothing
    let cargo_out = base.join("target/release");
    std::fs::create_dir_all(&cargo_out).unwrap();
    std::fs::create_dir_all(base.join("target/lib/python3.11/site-packages")).unwrap();
    assert!(installed_site_packages(&cargo_out.join("gpukit")).is_empty());
    let cargo_bin = base.join("cargo/bin");
    std::fs::create_dir_all(&cargo_bin).unwrap();
    assert!(installed_site_packages(&cargo_bin.join("gpukit")).is_empty());
    assert!(installed_site_packages(Path::new("gpukit")).is_empty());
    // order: $VIRTUAL_ENV's first, then the binary's own environment, then python3's; each once
    let active = base.join("active");
    let active_site = active.join("lib/python3.12/site-packages");
    std::fs::create_dir_all(&active_site).unwrap();
    let system_site = base.join("system/site-packages");
    std::fs::create_dir_all(&system_site).unwrap();
    let gone = base.join("gone/site-packages");
    assert_eq!(
        sites_in_order(
            Some(&active),
            installed_site_packages(&exe),
            vec![system_site.clone(), site.clone(), gone.clone()],
        ),
        vec![active_site.clone(), site.clone(), system_site.clone()]
    );
    // not activated: the binary's own environment is still found, before python3's
    assert_eq!(
        sites_in_order(
            None,
            installed_site_packages(&exe),
            vec![system_site.clone()]
        ),
        vec![site.clone(), system_site.clone()]
    );
    // activated and the same environment: once
    assert_eq!(
        sites_in_order(Some(&venv), installed_site_packages(&exe), vec![]),
        vec![site.clone()]
    );
    // a binary outside any environment: as before this change
    assert_eq!(
        sites_in_order(
            Some(&active),
            installed_site_packages(&cargo_out.join("gpukit")),
            vec![system_site.clone()]
        ),
        vec![active_site, system_site]
    );
    std::fs::remove_dir_all(&base).unwrap();
}

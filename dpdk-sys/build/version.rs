//! Which libdpdk versions dpdk-sys accepts (shared by build.rs and the crate's unit tests).

/// Accept Debian 12's 22.11 LTS and later LTS releases (YY.11.x); the reason otherwise.
pub(crate) fn check_version(version: &str) -> Result<(), String> {
    let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
    let (Some(Some(year)), Some(Some(month))) = (parts.next(), parts.next()) else {
        return Err(format!("cannot parse the libdpdk version `{version}`"));
    };
    if year < 22 || month != 11 {
        return Err(format!("libdpdk {version} is not a supported release (22.11 LTS or a later YY.11 LTS)"));
    }
    Ok(())
}

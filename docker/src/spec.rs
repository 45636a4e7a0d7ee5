//! The docker driver's own rules for a spec: it runs an image, and has no settings of
//! its own (no `"docker"` section).

use capstan_common::{ErrorCode, Rejection, Spec};

/// Refuses a spec the docker driver cannot run: one without `image`, or with settings
/// in a `docker` section (there are none to give; `{}` is none).
pub fn check_spec(spec: &Spec) -> Result<(), Rejection> {
    let invalid = |m: &str| Err(Rejection::new(ErrorCode::InvalidSpec, m));
    if spec.image.is_none() {
        return invalid("driver docker needs `image`");
    }
    capstan_common::validate::no_settings(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_common::DriverKind;

    fn spec(json: &str) -> Spec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_docker_spec_needs_an_image_and_carries_no_section() {
        check_spec(&spec(r#"{"driver":"docker","image":"busybox:1"}"#)).unwrap();
        let no_image = check_spec(&spec(r#"{"driver":"docker"}"#)).unwrap_err();
        assert_eq!(no_image.code, ErrorCode::InvalidSpec);
        assert_eq!(no_image.message, "driver docker needs `image`");
        let section = check_spec(&spec(
            r#"{"driver":"docker","image":"busybox:1","docker":{"x":1}}"#,
        ))
        .unwrap_err();
        assert!(section.message.contains("no settings of its own"));
        assert_eq!(spec(r#"{"driver":"docker"}"#).driver, DriverKind::DOCKER);
    }
}

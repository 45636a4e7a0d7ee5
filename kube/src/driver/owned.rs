//! Reading the objects a revision is made of with their owner checked: one under our
//! name that is not this host's capstan's is refused `not_owned`, never adopted.

use super::api::call;
use super::KubeDriver;
use crate::objects::{self, Owner};
use capstan_common::ErrorCode;
use capstan_driver::{DriverError, RevisionRef};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;

impl KubeDriver {
    pub(super) async fn deployment(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<Option<Deployment>, DriverError> {
        let name = objects::deployment_name(rev.workload);
        let api = self.deployments(rev.namespace);
        let found = call(op, &rev, || api.get_opt(&name)).await?;
        self.ours_or_refused(op, rev, found)
    }

    /// `rev`'s staged ConfigMap, if there is one; `not_owned` if one under its name is
    /// not ours (never adopted by a prepare, never deleted by a retire).
    pub(super) async fn staged(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
    ) -> Result<Option<ConfigMap>, DriverError> {
        let name = objects::staged_name(rev.workload, rev.revision);
        let api = self.config_maps(rev.namespace);
        let found = call(op, &rev, || api.get_opt(&name)).await?;
        self.ours_or_refused(op, rev, found)
    }

    /// `found` if it is absent or ours, else a `not_owned` refusal naming it.
    fn ours_or_refused<K>(
        &self,
        op: &'static str,
        rev: RevisionRef<'_>,
        found: Option<K>,
    ) -> Result<Option<K>, DriverError>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        match found {
            Some(o) if !objects::is_ours(o.meta().labels.as_ref(), &self.host) => {
                Err(DriverError::refused(
                    op,
                    rev,
                    ErrorCode::NotOwned,
                    format!(
                        "{} {} exists and is not this host's capstan's",
                        K::kind(&()),
                        o.meta().name.as_deref().unwrap_or_default()
                    ),
                ))
            }
            found => Ok(found),
        }
    }

    /// The tenant Namespace must exist and be ours.
    pub(super) async fn our_namespace(
        &self,
        op: &'static str,
        namespace: &str,
    ) -> Result<(), DriverError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let found = call(op, &namespace, || api.get_opt(namespace)).await?;
        match Owner::of(
            found.as_ref().map(|n| n.metadata.labels.as_ref()),
            &self.host,
        ) {
            Owner::Ours => Ok(()),
            Owner::Absent => Err(DriverError::refused(
                op,
                namespace,
                ErrorCode::NamespaceNotFound,
                "the Namespace does not exist",
            )),
            Owner::NotOurs => Err(not_ours(op, namespace)),
        }
    }
}

/// A `not_owned` refusal of `target`.
pub(super) fn not_ours(op: &'static str, target: &str) -> DriverError {
    DriverError::refused(
        op,
        target,
        ErrorCode::NotOwned,
        "it exists and is not this host's capstan's",
    )
}

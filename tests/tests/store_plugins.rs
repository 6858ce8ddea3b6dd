//! Store conformance, plugins: content-addressed and immutable, on every
//! backend.

use std::sync::Arc;

use ratchet_runtime::clock::SystemClock;
use ratchet_runtime::store::{PluginPut, PluginPutOutcome, StoreError};
use ratchet_tests::{Backend, Harness};

ratchet_tests::backend_tests! {
    same_bytes_twice_is_a_no_op_and_other_bytes_under_a_version_are_refused => immutable_versions;
}

fn put(digest: &str, version: &str) -> PluginPut {
    PluginPut {
        digest: digest.into(),
        name: "draft".into(),
        version: version.into(),
        manifest: "name = \"draft\"".into(),
        component: digest.as_bytes().to_vec(),
        now: 1,
    }
}

async fn immutable_versions(backend: Backend) {
    let Some(h) = Harness::on(backend, Arc::new(SystemClock)).await else {
        return;
    };
    let s = &h.store;
    assert_eq!(
        s.plugin_put(put("aaa", "1.0.0")).await.expect("put"),
        PluginPutOutcome::Inserted
    );
    assert_eq!(
        s.plugin_put(put("aaa", "1.0.0")).await.expect("again"),
        PluginPutOutcome::AlreadyPresent
    );
    let conflict = s.plugin_put(put("bbb", "1.0.0")).await;
    assert!(
        matches!(&conflict, Err(StoreError::VersionConflict { existing, .. }) if existing == "aaa"),
        "{conflict:?}"
    );
    assert_eq!(
        s.plugin_put(put("bbb", "1.1.0"))
            .await
            .expect("new version"),
        PluginPutOutcome::Inserted
    );
    let listed = s.plugin_list().await.expect("list");
    assert_eq!(listed.len(), 2);
    let record = s.plugin_get("aaa").await.expect("get").expect("stored");
    assert_eq!(record.component, b"aaa");
    assert_eq!(record.summary.version, "1.0.0");
    assert!(s.plugin_get("zzz").await.expect("get").is_none());
}

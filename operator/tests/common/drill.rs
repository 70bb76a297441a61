//! The test kit's ChaosDrill scene (`flashsale_e2e::drill`) as the tests
//! start it (with their operator), and what they read of a run through the
//! drill controller's own names for Chaos Mesh's kinds.

use std::{
    ops::{Deref, DerefMut},
    time::Duration,
};

use flashsale_controller_drill::chaos::{Kind, RUN_LABEL};
#[allow(unused_imports)] // each test binary uses a different part
pub use flashsale_e2e::drill::{
    SALE, THRESHOLD, drill, first_target, image, pod_failure, pod_kill, pod_of, until_scraped,
};
use flashsale_e2e::wait::poll_until;
use kube::{ResourceExt, api::DynamicObject};

use super::launcher;

/// One test's world: the kit's scene with the tests' operator.
pub struct DrillScene(flashsale_e2e::drill::DrillScene);

impl DrillScene {
    /// A namespace, a sale with no pods of its own, a gauge at `initial`
    /// that Prometheus already scraped, and the operator.
    pub async fn start(prefix: &str, initial: f64) -> anyhow::Result<Self> {
        Self::start_with(prefix, initial, &[]).await
    }

    /// [`start`](Self::start), the operator with `extra` flags.
    pub async fn start_with(prefix: &str, initial: f64, extra: &[&str]) -> anyhow::Result<Self> {
        Ok(Self(
            flashsale_e2e::drill::DrillScene::start(&launcher(), prefix, initial, extra).await?,
        ))
    }

    /// The Chaos Mesh objects of `kind` labelled with run `run`.
    pub async fn chaos_objects(&self, kind: Kind, run: &str) -> anyhow::Result<Vec<DynamicObject>> {
        self.objects(&kind.resource(), &format!("{RUN_LABEL}={run}"))
            .await
    }

    /// Every Chaos Mesh object (Workflow and experiment) of run `run`, as
    /// `Kind/name`.
    pub async fn run_objects(&self, run: &str) -> anyhow::Result<Vec<String>> {
        let mut all = Vec::new();
        for kind in [Kind::Workflow].into_iter().chain(Kind::EXPERIMENTS) {
            for object in self.chaos_objects(kind, run).await? {
                all.push(format!("{}/{}", kind.name(), object.name_any()));
            }
        }
        Ok(all)
    }

    /// Waits until no Chaos Mesh object of run `run` is left.
    pub async fn until_no_chaos(&self, run: &str, deadline: Duration) -> anyhow::Result<()> {
        poll_until(
            &format!("run {run}'s chaos gone"),
            deadline,
            Duration::from_millis(50),
            || async {
                let left = self.run_objects(run).await.map_err(|e| e.to_string())?;
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(left.join(", "))
                }
            },
        )
        .await
        .map_err(Into::into)
    }

    /// Checks for `window` that run `run` never has a Chaos Mesh object.
    pub async fn never_injects(&self, run: &str, window: Duration) -> anyhow::Result<()> {
        let until = tokio::time::Instant::now() + window;
        while tokio::time::Instant::now() < until {
            let objects = self.run_objects(run).await?;
            anyhow::ensure!(
                objects.is_empty(),
                "run {run} created {objects:?} after it was stopped"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

impl Deref for DrillScene {
    type Target = flashsale_e2e::drill::DrillScene;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for DrillScene {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

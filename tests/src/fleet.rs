//! A fleet of `ratchet worker` processes for racing and chaos tests: spawn,
//! watch their progress through their log lines, SIGKILL and restart.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::mpsc;

/// One line of progress from worker `index` (an attempt that finished).
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub index: usize,
}

pub struct Fleet {
    bin: String,
    url: String,
    extra: Vec<String>,
    children: Vec<Option<Child>>,
    progress_tx: mpsc::UnboundedSender<Progress>,
    pub progress: mpsc::UnboundedReceiver<Progress>,
    pub kills: usize,
}

impl Fleet {
    /// `extra` are `ratchet worker` arguments shared by every process.
    pub fn new(bin: &str, url: &str, extra: &[&str]) -> Self {
        let (progress_tx, progress) = mpsc::unbounded_channel();
        Self {
            bin: bin.to_string(),
            url: url.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            children: Vec::new(),
            progress_tx,
            progress,
            kills: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.children.len()
    }

    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// Starts worker `index` (a new slot when `index == len()`).
    pub fn start(&mut self, index: usize) {
        let mut cmd = crate::ratchet(&self.bin, &self.url);
        cmd.arg("worker")
            .args(&self.extra)
            .args(["--worker-id", &format!("fleet-{index}-{}", self.kills)])
            .env("RATCHET_LOG", "ratchet_runtime::scheduler=info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn worker");
        let stderr = child.stderr.take().expect("stderr");
        let tx = self.progress_tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("stage succeeded") || line.contains("attempt failed") {
                    let _ = tx.send(Progress { index });
                }
            }
        });
        if index == self.children.len() {
            self.children.push(Some(child));
        } else {
            self.children[index] = Some(child);
        }
    }

    /// SIGKILLs worker `index` and waits for it to be gone.
    pub async fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.children[index].take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(crate::BOUND, child.wait()).await;
            self.kills += 1;
        }
    }

    /// Stops every worker with SIGTERM and waits for each to exit.
    pub async fn stop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let mut child = child;
            let _ = tokio::time::timeout(crate::BOUND, child.wait()).await;
        }
    }

    /// Waits until every worker has exited by itself (`--until-idle`).
    pub async fn wait_all(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::as_mut) {
            let status = tokio::time::timeout(crate::BOUND, child.wait())
                .await
                .expect("worker exited within the bound")
                .expect("wait");
            assert!(status.success(), "a worker failed: {status:?}");
        }
    }
}

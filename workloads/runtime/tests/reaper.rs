//! Exited children are reaped, not left as zombies. A binary of its own:
//! reaping takes any child's exit status, which no other test may wait for.

use std::{path::Path, process::Command, time::Duration};

use flashsale_runtime::reaper::reap;

/// The state letter of process `pid` (`Z` for a zombie), if it exists.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[test]
fn exited_children_are_reaped_and_leave_no_zombie() -> anyhow::Result<()> {
    let children: Vec<u32> = (0..3)
        .map(|_| Ok(Command::new("true").spawn()?.id()))
        .collect::<anyhow::Result<_>>()?;
    // Each child exits at once and, unwaited for, stays a zombie.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while children.iter().any(|&pid| state(pid) != Some('Z')) {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "children did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(reap(), 3);
    for pid in children {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "{pid} left");
    }
    assert_eq!(reap(), 0);
    Ok(())
}

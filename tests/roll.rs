//! `pmcheck roll begin|end` (issue 46, part 8): one roll at a time, from any control node. A
//! mark drains nothing, a second roll's `begin` is refused naming the first, `status` shows it,
//! and the roll's `end` (or `--force` for a roll whose play is gone) takes it away.

mod common;

use common::operator::*;
use common::*;

fn roll(s: &Setup, args: &[&str]) -> std::process::Output {
    s.pmcheck("roll", args)
}

#[test]
fn one_roll_at_a_time_and_a_mark_drains_nothing() {
    let s = Setup::new(Behavior::Running);
    let d = daemon(&s);
    let first = [
        "begin",
        "--name",
        "ctl1 20261127T200000Z",
        "--reason",
        "systemctl restart puppetserver",
    ];
    let out = roll(&s, &first);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_contains!(
        text(&out.stdout),
        "pmcheck roll: marked this master for roll ctl1 20261127T200000Z until "
    );
    // The mark drains nothing: the node still answers OK, and status shows the roll.
    assert_eq!(quiet_poll(&d).status, 200);
    let status = s.pmcheck("status", &["--url", &url(&d)]);
    assert_contains!(
        text(&status.stdout),
        "roll:   roll ctl1 20261127T200000Z (systemctl restart puppetserver; by "
    );
    assert!(record(&s).is_none(), "no drain record");

    // A second roll, from another control node, is refused and names the first.
    let out = roll(&s, &["begin", "--name", "ctl2 20261127T200100Z"]);
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    assert_contains!(
        text(&out.stderr),
        "another roll is under way here: roll ctl1 20261127T200000Z (systemctl restart puppetserver; by "
    );
    // The first roll's step again renews its own mark.
    let out = roll(&s, &first);
    assert_contains!(
        text(&out.stdout),
        "renewed roll ctl1 20261127T200000Z's mark until "
    );

    // The second roll's end leaves the first's mark; the first's takes it away.
    let out = roll(&s, &["end", "--name", "ctl2 20261127T200100Z"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_contains!(
        text(&out.stderr),
        "the mark here is not roll ctl2 20261127T200100Z's but roll ctl1"
    );
    let out = roll(&s, &["end", "--name", "ctl1 20261127T200000Z"]);
    assert_contains!(
        text(&out.stdout),
        "roll ctl1 20261127T200000Z ended here; its mark is removed"
    );
    let out = roll(&s, &["begin", "--name", "ctl2 20261127T200100Z"]);
    assert_eq!(out.status.code(), Some(0), "its turn now: {out:?}");
}

#[test]
fn a_lapsed_mark_is_replaced_and_an_unreadable_one_refuses_until_forced_away() {
    let s = Setup::new(Behavior::Running);
    let out = roll(&s, &["begin", "--name", "gone", "--for", "1ms"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = roll(&s, &["begin", "--name", "next"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_contains!(text(&out.stdout), "in place of the lapsed roll gone (");

    std::fs::write(s.state.path().join("roll"), "half a mark").unwrap();
    let out = roll(&s, &["begin", "--name", "next"]);
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    assert_contains!(text(&out.stderr), "cannot read the roll mark ");
    let out = roll(&s, &["end", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!s.state.path().join("roll").exists());
    for bad in [
        &["begin", "--name", "a\nb"][..],
        &["begin", "--name", "ctl1  two spaces"],
        &["begin", "--force"],
    ] {
        let out = roll(&s, bad);
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {out:?}");
    }
}

/// An option of the other step was accepted and ignored: `begin --force` replaced nothing and
/// `end --for 1h` ended at once. Each is refused (64), names itself, and touches no mark.
#[test]
fn an_option_of_the_other_step_is_refused_and_changes_nothing() {
    let s = Setup::new(Behavior::Running);
    let out = roll(&s, &["begin", "--name", "ctl1", "--reason", "upgrade"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mark = s.state.path().join("roll");
    let before = std::fs::read(&mark).unwrap();
    for (args, said) in [
        (
            &["begin", "--name", "ctl2", "--force"][..],
            "--force is not for `roll begin`: a roll's begin never takes another roll's mark away; end that roll first",
        ),
        (
            &["end", "--name", "ctl1", "--reason", "done"],
            "--reason is not for `roll end`: ",
        ),
        (
            &["end", "--name", "ctl1", "--for", "1h"],
            "--for is not for `roll end`: ",
        ),
        (
            &["end", "--force", "--for", "1h"],
            "--for is not for `roll end`: ",
        ),
    ] {
        let out = roll(&s, args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert_contains!(text(&out.stderr), said, "{args:?}");
        assert_eq!(
            std::fs::read(&mark).unwrap(),
            before,
            "{args:?} changed the mark"
        );
    }
    let out = roll(&s, &["end", "--name", "ctl1"]);
    assert_contains!(
        text(&out.stdout),
        "roll ctl1 ended here; its mark is removed"
    );
}

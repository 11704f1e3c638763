use super::*;
use crate::callable::identity::Digest;
use crate::dfx::graph::{DagCapture, TaskNode};

/// A run of three tasks: 0 and 1 ran on two lanes, 2 depended on 1 and failed; 3 never ran.
fn sample() -> Timeline {
    let mut cap = DagCapture::default();
    let node = |index: u32, callable: &str| TaskNode {
        index,
        callable: callable.to_string(),
        digest: Digest::from_bytes([index as u8; 32]),
        target: "sub".to_string(),
        members: 1,
    };
    cap.record(node(0, "load"), vec![]);
    cap.record(node(1, "scale<f32>"), vec![]);
    cap.record(node(2, "sum"), vec![(1, EdgeReason::Explicit { retain: true })]);
    cap.record(node(3, "never"), vec![(2, EdgeReason::Explicit { retain: true })]);
    let mut rec = Recorder::default();
    let err = Error::new(crate::error::ErrorKind::TaskFailed, "sum failed: \"boom\" <x>");
    for i in 0..4 {
        rec.submitted(i, 1_000 + u64::from(i));
    }
    rec.note(0, TaskEvent::Ready, 1_100);
    rec.note(0, TaskEvent::Started(&"sub worker 0".into()), 2_000);
    rec.note(0, TaskEvent::Ended(Ok(())), 12_000);
    rec.note(1, TaskEvent::Ready, 1_100);
    rec.note(1, TaskEvent::Started(&"chip 1".into()), 3_000);
    rec.note(1, TaskEvent::Ended(Ok(())), 5_000);
    rec.note(2, TaskEvent::Ready, 5_100);
    rec.note(2, TaskEvent::Started(&"chip 0".into()), 6_000);
    rec.note(2, TaskEvent::Ended(Err(&err)), 20_000);
    rec.note(3, TaskEvent::NotRun(&err), 20_001);
    rec.note(99, TaskEvent::Ready, 1); // not a task: ignored
    let dag = cap.to_dag();
    let records = rec.records(&dag, Level::Node);
    Timeline::new(dag, records)
}

#[test]
fn records_keep_each_tasks_times_worker_and_outcome() {
    let t = sample();
    let r = t.records();
    assert_eq!(r.len(), 4);
    assert_eq!(
        (r[0].worker.as_str(), r[0].status, r[0].duration()),
        ("sub worker 0", TaskStatus::Completed, Some(Duration::from_nanos(10_000)))
    );
    assert_eq!((r[2].status, r[2].waited()), (TaskStatus::Failed, Some(Duration::from_nanos(900))));
    assert!(r[2].error.as_deref().unwrap().contains("boom"));
    assert_eq!((r[3].status, r[3].started_ns, r[3].worker.as_str()), (TaskStatus::NotRun, None, ""));
    let lanes: Vec<String> = t.lanes().into_iter().map(|(_, n)| n).collect();
    assert_eq!(lanes, ["sub worker 0", "chip 0", "chip 1"]);
}

#[test]
fn the_chrome_trace_has_a_lane_per_worker_a_box_per_task_and_flows() {
    let json = sample().to_chrome_trace();
    // Names of the lanes, a complete event per task that ran, a flow for 1 -> 2 (not for
    // 2 -> 3: 3 never ran), and every quote in the error escaped.
    for needle in [
        "\"name\":\"thread_name\",\"pid\":3,\"tid\":1,\"args\":{\"name\":\"sub worker 0\"}",
        "\"ph\":\"X\",\"name\":\"load\",\"cat\":\"completed\",\"pid\":3,\"tid\":1,\"ts\":1.000,\"dur\":10.000",
        "\"ph\":\"X\",\"name\":\"sum\",\"cat\":\"failed\",\"pid\":3,\"tid\":2",
        "\"ph\":\"s\",\"id\":0,",
        "\"ph\":\"f\",\"bp\":\"e\",\"id\":0,",
        "sum failed: \\\"boom\\\" <x>",
    ] {
        assert!(json.contains(needle), "{needle} in {json}");
    }
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 3);
    assert_eq!(json.matches("\"ph\":\"s\"").count(), 1);
    // Balanced braces and brackets: a viewer can parse it.
    assert_eq!(json.matches('{').count(), json.matches('}').count());
    assert_eq!(json.matches('[').count(), json.matches(']').count());
}

#[test]
fn the_svg_draws_lanes_boxes_and_an_axis_without_outside_resources() {
    let svg = sample().to_svg();
    assert_eq!(svg.matches("<rect x=").count(), 3, "{svg}");
    assert!(svg.contains("fill=\"#e53935\"") && svg.contains("fill=\"#4caf50\""));
    assert!(svg.contains(">L3 chip 1</text>"));
    assert!(svg.contains("&lt;x&gt;") && !svg.contains("<x>"), "the error is escaped");
    assert_eq!(xml_escape("a\u{1b}b\n\0"), "a\u{FFFD}b\n\u{FFFD}", "no control character XML forbids");
    assert!(svg.contains(">0 ns</text>") && svg.contains(" us</text>"), "an axis in microseconds");
    assert!(!svg.contains("href") && !svg.contains("<script"));
}

#[test]
fn the_dot_labels_tasks_with_workers_and_times() {
    let dot = sample().to_dot();
    assert!(
        dot.contains(
            "t0 [label=\"0: load\\nsub worker 0\\nat 1 us, ran 10 us\", style=filled, fillcolor=palegreen];"
        ),
        "{dot}"
    );
    assert!(dot.contains("t3 [label=\"3: never\\n(not run)\", style=filled, fillcolor=lightgrey];"));
    assert!(dot.contains("t1 -> t2 [label=\"add_dep\"];"));
}

#[test]
fn steps_and_units_are_round() {
    assert_eq!(nice_step(3.0), 5.0);
    assert_eq!(nice_step(1200.0), 2000.0);
    assert_eq!(show_ns(1500.0), "1.5 us");
    assert_eq!(show_ns(2_000_000.0), "2 ms");
    assert_eq!(lane_order("sub worker 10").1, 10);
    assert!(lane_order("sub worker 2") < lane_order("sub worker 10"));
    assert!(lane_order("sub worker 9") < lane_order("chip 0"));
}

#[test]
fn entries_round_trip_and_nest_under_the_task_they_ran_in() {
    let t = sample();
    let kernel = |index: u32, worker: &str, at: u64| TaskRecord {
        index,
        callable: format!("k{index}"),
        worker: worker.to_string(),
        level: Level::Chip,
        submitted_ns: at,
        ready_ns: Some(at),
        staged_ns: None,
        started_ns: Some(at + 1),
        ended_ns: Some(at + 2),
        status: TaskStatus::Completed,
        error: None,
        within: vec![],
    };
    // Process 50 ran task 1 of run 9 of engine 2 of process 7 (this sample); process 60 ran
    // task 0 of process 50's run 4 of its engine 3; garbage ends the log.
    let entries = [
        Entry {
            writer: 50,
            parent: (7, 2, 9, 1),
            member: 0,
            engine: 3,
            run: 4,
            records: vec![kernel(0, "core 1", 3_100)],
        },
        Entry {
            writer: 60,
            parent: (50, 3, 4, 0),
            member: 0,
            engine: 1,
            run: 0,
            records: vec![kernel(0, "core 0", 3_200)],
        },
        // Another run, and the same run number of another engine of process 7: not ours.
        Entry {
            writer: 70,
            parent: (7, 2, 8, 1),
            member: 0,
            engine: 1,
            run: 0,
            records: vec![kernel(0, "core 0", 1)],
        },
        Entry {
            writer: 80,
            parent: (7, 5, 9, 1),
            member: 0,
            engine: 1,
            run: 0,
            records: vec![kernel(0, "core 0", 1)],
        },
    ];
    let mut log: Vec<u8> = entries.iter().flat_map(encode_entry).collect();
    log.extend_from_slice(&[9, 0, 0, 0, b'S', b'P']); // truncated
    let decoded = decode_entries(&log);
    assert_eq!(decoded, entries);
    let mut bad = encode_entry(&entries[0]);
    bad[4] = b'X'; // not the magic: skipped, the next entry still read
    bad.extend(encode_entry(&entries[1]));
    assert_eq!(decode_entries(&bad), [entries[1].clone()]);
    // A writer killed in the middle of its entry: the entries around it survive.
    let torn = encode_entry(&entries[1]);
    let mut log = encode_entry(&entries[0]);
    log.extend_from_slice(&torn[..torn.len() / 2]);
    log.extend(encode_entry(&entries[2]));
    assert_eq!(decode_entries(&log), [entries[0].clone(), entries[2].clone()]);
    // Hostile bytes: never a panic, never more entries than whole ones in the input.
    let whole: Vec<u8> = entries.iter().flat_map(encode_entry).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2000 {
        let mut m = whole.clone();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed as usize) % m.len();
            m[at] = (seed >> 32) as u8;
        }
        m.truncate((seed as usize >> 8) % (m.len() + 1));
        assert!(decode_entries(&m).len() <= entries.len());
    }
    let t = t.with_inner(&decoded, (7, 2, 9));
    let inner: Vec<(&str, &[u32])> =
        t.inner_records().iter().map(|r| (r.worker.as_str(), &r.within[..])).collect();
    assert_eq!(inner, [("chip 1 / core 1 / core 0", &[1, 0][..]), ("chip 1 / core 1", &[1][..])]);
    assert_eq!(t.to_chrome_trace().matches("\"ph\":\"X\"").count(), 5);
}

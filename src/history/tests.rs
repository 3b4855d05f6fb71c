use super::*;

const KEEP_3: Limits = Limits {
    size: 3,
    ttl: Duration::from_secs(300),
};

fn seqs(history: &History, since: u64) -> Vec<u64> {
    history.after(since).iter().map(|m| m.seq).collect()
}

#[test]
fn keeps_the_last_messages_in_order_with_their_kind() {
    let mut h = History::default();
    for seq in 1..=5 {
        h.push(
            seq,
            format!("m{seq}").as_bytes(),
            DataKind::Text,
            Tags::default(),
            0,
            KEEP_3,
        );
    }
    h.push(6, &[0, 255], DataKind::Binary, Tags::default(), 0, KEEP_3);
    assert_eq!(h.len(), 3);
    assert_eq!(h.oldest_seq(), Some(4));
    let kept = h.after(0);
    assert_eq!(kept[0].payload, Bytes::from_static(b"m4"));
    assert_eq!(kept[2].payload, Bytes::from_static(&[0, 255]));
    assert_eq!(kept[2].kind, DataKind::Binary);
    assert_eq!(kept[1].kind, DataKind::Text);
    assert_eq!(seqs(&h, 4), vec![5, 6]);
    assert_eq!(seqs(&h, 6), Vec::<u64>::new());
    assert_eq!(seqs(&h, 99), Vec::<u64>::new());
}

#[test]
fn old_messages_expire_and_give_their_memory_back() {
    let mut h = History::default();
    let limits = Limits {
        size: 100,
        ttl: Duration::from_secs(10),
    };
    h.push(1, &[7; 1000], DataKind::Binary, Tags::default(), 0, limits);
    h.push(2, b"b", DataKind::Text, Tags::default(), 5, limits);
    h.expire(10, limits.ttl);
    assert_eq!(seqs(&h, 0), vec![2]);
    h.expire(15, limits.ttl);
    assert!(h.is_empty());
    assert_eq!(h.heap_bytes(), 0);
    // The next message follows on from the expired ones.
    h.push(3, b"c", DataKind::Text, Tags::default(), 16, limits);
    assert_eq!(seqs(&h, 0), vec![3]);
}

#[test]
fn a_gap_in_seqs_starts_the_history_afresh() {
    let mut h = History::default();
    h.push(1, b"a", DataKind::Text, Tags::default(), 0, KEEP_3);
    h.push(2, b"b", DataKind::Text, Tags::default(), 0, KEEP_3);
    h.push(1, b"again", DataKind::Text, Tags::default(), 0, KEEP_3);
    assert_eq!(seqs(&h, 0), vec![1]);
    assert_eq!(h.after(0)[0].payload, Bytes::from_static(b"again"));
}

#[test]
fn limits_of_zero_keep_nothing() {
    let mut h = History::default();
    let off = Limits {
        size: 0,
        ttl: Duration::from_secs(300),
    };
    h.push(1, b"a", DataKind::Text, Tags::default(), 0, off);
    assert!(h.is_empty());
    let no_ttl = Limits {
        size: 10,
        ttl: Duration::ZERO,
    };
    h.push(1, b"a", DataKind::Text, Tags::default(), 0, no_ttl);
    assert!(h.is_empty() && h.heap_bytes() == 0);
}

#[test]
fn a_kept_message_costs_its_payload_and_an_entry() {
    assert_eq!(std::mem::size_of::<Entry>(), 8);
    let mut h = History::default();
    let limits = Limits {
        size: 100,
        ttl: Duration::from_secs(300),
    };
    for seq in 1..=100 {
        h.push(seq, &[b'x'; 32], DataKind::Text, Tags::default(), 0, limits);
    }
    // A message without a sender keeps its payload alone in the byte ring.
    assert_eq!(h.bytes.len(), 100 * 32);
    // 100 × (32 + 8) = 4,000 bytes of content; the rings may round up.
    assert!(h.heap_bytes() <= 2 * 4_000, "{}", h.heap_bytes());

    // A chat message adds its sender's name and one length byte.
    let mut chat = History::default();
    for seq in 1..=100 {
        chat.push(
            seq,
            &[b'x'; 32],
            DataKind::Text,
            Tags {
                from: Some("c123"),
                event: None,
            },
            0,
            limits,
        );
    }
    assert_eq!(chat.bytes.len(), 100 * (32 + 1 + 4));
    assert!(chat.heap_bytes() <= 2 * 4_500, "{}", chat.heap_bytes());
}

#[test]
fn a_chat_message_keeps_its_sender() {
    let mut h = History::default();
    h.push(1, b"hi", DataKind::Text, from("c7"), 0, KEEP_3);
    h.push(2, b"news", DataKind::Text, Tags::default(), 0, KEEP_3);
    h.push(3, &[0, 255], DataKind::Binary, from("c12345"), 0, KEEP_3);
    h.push(4, b"", DataKind::Text, from("c8"), 0, KEEP_3);
    // seq 1 (with a sender) fell out: the ring lines up on the next one.
    let kept = h.after(0);
    let got: Vec<(u64, &[u8], DataKind, Option<&str>)> = kept
        .iter()
        .map(|m| (m.seq, &m.payload[..], m.kind, m.from.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, &b"news"[..], DataKind::Text, None),
            (3, &[0u8, 255][..], DataKind::Binary, Some("c12345")),
            (4, &b""[..], DataKind::Text, Some("c8")),
        ]
    );
    // Skipping a message with a sender finds the next one's bytes.
    let after_3 = h.after(3);
    assert_eq!(
        (after_3[0].seq, after_3[0].from.as_deref()),
        (4, Some("c8"))
    );
    h.push(5, b"x", DataKind::Text, Tags::default(), 0, KEEP_3);
    h.push(6, b"y", DataKind::Text, Tags::default(), 0, KEEP_3);
    assert_eq!(h.bytes.len(), 1 + 2 + 2);
    h.push(7, b"z", DataKind::Text, Tags::default(), 0, KEEP_3);
    assert_eq!(h.bytes.len(), 3);
}

fn from(name: &str) -> Tags<'_> {
    Tags {
        from: Some(name),
        event: None,
    }
}

#[test]
fn event_names_are_kept_beside_senders_and_skipped_over_like_them() {
    let mut h = History::default();
    let both = Tags {
        from: Some("c1"),
        event: Some("price"),
    };
    let event = Tags {
        from: None,
        event: Some("client-typing"),
    };
    h.push(1, b"a", DataKind::Text, both, 0, KEEP_3);
    h.push(2, b"b", DataKind::Text, event, 0, KEEP_3);
    h.push(3, b"c", DataKind::Text, Tags::default(), 0, KEEP_3);
    let kept = h.after(0);
    let got: Vec<_> = kept
        .iter()
        .map(|m| (m.seq, &m.payload[..], m.from.as_deref(), m.event.as_deref()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, &b"a"[..], Some("c1"), Some("price")),
            (2, &b"b"[..], None, Some("client-typing")),
            (3, &b"c"[..], None, None),
        ]
    );
    assert_eq!(h.after(1)[0].event.as_deref(), Some("client-typing"));
    h.push(4, b"d", DataKind::Text, Tags::default(), 0, KEEP_3);
    assert_eq!(h.bytes.len(), 1 + 13 + 1 + 1 + 1);
}

#[test]
fn a_name_too_long_for_its_length_byte_is_not_kept_but_its_message_is() {
    let mut h = History::default();
    let long = "n".repeat(MAX_FROM + 1);
    let longest = "m".repeat(MAX_FROM);
    h.push(1, b"a", DataKind::Text, from(&long), 0, KEEP_3);
    h.push(2, b"b", DataKind::Text, from(&longest), 0, KEEP_3);
    let kept = h.after(0);
    assert_eq!(
        (kept[0].payload.as_ref(), kept[0].from.as_deref()),
        (&b"a"[..], None)
    );
    assert_eq!(kept[1].from.as_deref(), Some(longest.as_str()));
    assert_eq!(kept[1].payload, Bytes::from_static(b"b"));
}

fn push_n(h: &mut History, seqs: std::ops::RangeInclusive<u64>, size: usize) {
    let limits = Limits {
        size: 100,
        ttl: Duration::from_secs(300),
    };
    for seq in seqs {
        h.push(
            seq,
            &vec![b'x'; size],
            DataKind::Text,
            Tags::default(),
            0,
            limits,
        );
    }
}

#[test]
fn a_push_over_the_budget_drops_its_own_channels_oldest() {
    let budget = Arc::new(Budget::new(1_000));
    let mut other = History::with_budget(Arc::clone(&budget));
    push_n(&mut other, 1..=1, 392);
    let mut h = History::with_budget(Arc::clone(&budget));
    push_n(&mut h, 1..=1, 392);
    assert_eq!(budget.held(), 800);
    // 1,200 held: over. The pushing channel drops its own oldest.
    push_n(&mut h, 2..=2, 392);
    assert_eq!((h.len(), h.oldest_seq()), (1, Some(2)));
    assert_eq!((other.len(), budget.held()), (1, 800));
    // A message that cannot fit is not kept either; the next seq follows on.
    push_n(&mut h, 3..=3, 2_000);
    assert_eq!((h.len(), h.oldest_seq()), (0, None));
    assert_eq!(budget.held(), 400);
    assert_eq!(h.heap_bytes(), 0);
    push_n(&mut h, 4..=4, 92);
    assert_eq!(seqs(&h, 0), vec![4]);
    assert_eq!(budget.held(), 500);
}

#[test]
fn a_long_payload_is_kept_by_reference_and_shared_by_every_reader() {
    let budget = Arc::new(Budget::new(usize::MAX));
    let mut h = History::with_budget(Arc::clone(&budget));
    let long = Bytes::from(vec![7u8; SHARE_FROM]);
    h.push(1, b"short", DataKind::Text, from("c1"), 0, KEEP_3);
    h.push_bytes(2, &long, DataKind::Binary, from("c2"), 0, KEEP_3);
    h.push(
        3,
        &[9u8; 2 * SHARE_FROM],
        DataKind::Text,
        Tags::default(),
        0,
        KEEP_3,
    );
    assert_eq!(budget.held(), h.held_bytes());
    assert_eq!(
        h.held_bytes(),
        (3 + 5 + 8) + (3 + SHARE_FROM + 8) + (2 * SHARE_FROM + 8)
    );
    let (first, second) = (h.after(0), h.after(1));
    assert_eq!(
        first[1].payload.as_ptr(),
        long.as_ptr(),
        "the publish's buffer"
    );
    assert_eq!(second[0].payload.as_ptr(), long.as_ptr());
    assert_eq!(first[2].payload.as_ptr(), second[1].payload.as_ptr());
    assert_eq!(first[0].payload, &b"short"[..]);
    assert_eq!(first[1].from.as_deref(), Some("c2"));
    assert_eq!(first[1].kind, DataKind::Binary);
    assert_eq!(first[2].payload.len(), 2 * SHARE_FROM);
    // The oldest go, shared or not, in order; what follows still lines up.
    h.push(4, b"tail", DataKind::Text, Tags::default(), 0, KEEP_3);
    h.push(5, b"end", DataKind::Text, Tags::default(), 0, KEEP_3);
    assert_eq!(seqs(&h, 0), vec![3, 4, 5]);
    assert_eq!(h.after(3)[0].payload, &b"tail"[..]);
    assert_eq!(budget.held(), (2 * SHARE_FROM + 8) + (4 + 8) + (3 + 8));
    drop(h);
    assert_eq!(budget.held(), 0);
}

#[test]
fn what_a_history_holds_goes_back_to_its_budget() {
    let budget = Arc::new(Budget::new(usize::MAX));
    let limits = Limits {
        size: 2,
        ttl: Duration::from_secs(10),
    };
    let mut h = History::with_budget(Arc::clone(&budget));
    h.push(1, b"abc", DataKind::Text, from("c1"), 0, limits);
    h.push(2, b"de", DataKind::Text, Tags::default(), 5, limits);
    assert_eq!(budget.held(), h.held_bytes());
    assert_eq!(budget.held(), (3 + 3 + 8) + (2 + 8));
    h.push(3, b"f", DataKind::Binary, Tags::default(), 5, limits);
    assert_eq!(budget.held(), h.held_bytes());
    // A gap in seqs starts afresh.
    h.push(9, b"g", DataKind::Text, Tags::default(), 5, limits);
    assert_eq!(budget.held(), 9);
    h.expire(20, limits.ttl);
    assert_eq!(budget.held(), 0);
    h.push(10, b"hi", DataKind::Text, Tags::default(), 20, limits);
    h.trim_to(0);
    assert_eq!((budget.held(), h.oldest_seq()), (0, None));
    h.push(11, b"jk", DataKind::Text, Tags::default(), 20, limits);
    assert_eq!(seqs(&h, 0), vec![11]);
    drop(h);
    assert_eq!(budget.held(), 0);
}

#[test]
fn trimming_to_a_level_tells_the_gap_as_expiry_does() {
    let mut h = History::default();
    push_n(&mut h, 1..=5, 92);
    h.trim_to(250);
    assert_eq!((h.len(), h.oldest_seq()), (2, Some(4)));
    assert_eq!(seqs(&h, 0), vec![4, 5]);
}

#[test]
fn the_trim_level_cuts_the_largest_first() {
    assert_eq!(trim_level(&mut [10, 20], 30), None);
    // 50 + 30 + 10 into 60: the two largest cut to 25.
    assert_eq!(trim_level(&mut [10, 50, 30], 60), Some(25));
    // Into 80: only the largest, to 40.
    assert_eq!(trim_level(&mut [10, 50, 30], 80), Some(40));
    assert_eq!(trim_level(&mut [10, 50, 30], 0), Some(0));
    assert_eq!(trim_level(&mut [7, 7, 7], 20), Some(6));
    let mut sizes = vec![1_000, 3, 400, 400, 2];
    let level = trim_level(&mut sizes, 500).unwrap();
    let kept: usize = sizes.iter().map(|&s| s.min(level)).sum();
    assert!(kept <= 500 && kept + 5 > 500, "{level} keeps {kept}");
}

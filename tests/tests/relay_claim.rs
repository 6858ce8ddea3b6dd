//! How a relay's claim finds the runs it may send, and what recording
//! results costs: on PostgreSQL through the lanes of runs with pending
//! deliveries, each read from its place (migrations 0025 and 0026, ADRs
//! 0038 and 0039).

use std::collections::HashMap;
use std::sync::Arc;

use ratchet_runtime::clock::{Clock, ManualClock};
use ratchet_runtime::relay::{Relay, RelayConfig, Sinks};
use ratchet_runtime::store::{
    ClaimedDelivery, DeliveryClaim, DeliveryFilter, DeliveryFinish, DeliveryResult, DeliveryRow,
    DeliveryState, PostgresStore, Redeliver,
};
use ratchet_tests::events::{commit_chains, hooks_routing, route_to_hooks};
use ratchet_tests::nats::jetstream;
use ratchet_tests::{BOUND, Backend, Harness};
use serde_json::Value;
use tokio::sync::RwLock;

ratchet_tests::backend_tests! {
    deliveries_pending_before_an_upgrade_are_claimed_after_it => pending_across_upgrade;
    dead_letters_from_before_an_upgrade_are_counted_and_redelivered_after_it => dead_across_upgrade;
}

/// Taken for writing by the test that counts index entries, which runs
/// alone; for reading by this file's other tests, which run side by side.
/// A transaction open beside that test in the same database keeps the old
/// row versions its updates would make room with.
static ALONE: RwLock<()> = RwLock::const_new(());

fn claim(now: i64, runs: usize, per_run: usize) -> DeliveryClaim {
    DeliveryClaim {
        relay: "relay".into(),
        sinks: vec!["hooks".into()],
        now,
        lease_ms: 60_000,
        runs,
        per_run,
    }
}

/// The buffers a plan read, its parts included.
fn buffers(plan: &Value) -> i64 {
    let node = &plan[0]["Plan"];
    let count = |key| node.get(key).and_then(Value::as_i64).unwrap_or(0);
    count("Shared Hit Blocks") + count("Shared Read Blocks")
}

/// 128 runs of 64 events each, committed round by round (every run's first
/// event, then every run's second, …) and routed to `hooks`; half the runs
/// are leased at their first event, the other half have had 32 delivered.
/// A claim of 16 runs then reads about what 16 runs' first deliveries
/// take, however far apart the runs have come.
///
/// Each lane is read from its place (migration 0026): seen failing with
/// recording results leaving the place where it was (the runs' first
/// event), when the claim passed the 32 delivered deliveries of each run
/// it looked at and read 681 buffers, against 170.
///
/// The claim before the lanes walked the pending deliveries in the order
/// they fell due and asked of each whether an earlier one of its run was
/// pending; the leased runs' deliveries all came first. Run by hand on
/// this test's database afterwards (its index of due deliveries put back),
/// it read 6,392 buffers, against 172 for the lanes' claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_postgres_reads_no_more_when_runs_have_come_to_different_points() {
    let _beside = ALONE.read().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    let (runs, per_run) = (128, 64);
    // Runs 0 to 63 stay leased, as a relay's runs in flight are; runs 64
    // to 127 have their first 32 delivered and the rest handed back unsent.
    let claimed = claimed_backlog(&h, runs, per_run, clock.now_ms()).await;
    // Claimed in commit order: a run's count so far is where each falls.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut finished = Vec::new();
    for d in &claimed {
        let nth = seen.entry(&d.event.run_id).or_default();
        let delivered = *nth < per_run / 2;
        *nth += 1;
        if run_number(d) < runs / 2 {
            continue;
        }
        finished.push(DeliveryFinish {
            id: d.id,
            relay: "relay".into(),
            lease: d.lease,
            attempts: d.attempts,
            result: if delivered {
                DeliveryResult::Delivered { status: None }
            } else {
                DeliveryResult::Unsent
            },
            now: clock.now_ms(),
        });
    }
    let (recorded, _) = h
        .store
        .deliveries_finish_then_claim(&finished, None)
        .await
        .expect("record");
    assert!(recorded.iter().all(|r| *r), "every result recorded");

    let pg = PostgresStore::open(&h.url).await.expect("open");
    let c = claim(clock.now_ms(), 16, 1);
    // The first look may tidy what the results left on the pages (old row
    // versions); the second is what every later claim reads.
    pg.explain_delivery_claim(&c).await.expect("explain");
    let plan = pg.explain_delivery_claim(&c).await.expect("explain");
    let read = buffers(&plan);
    println!("claiming 16 runs read {read} buffers");
    assert!(
        read <= 400,
        "claiming 16 of 128 runs read {read} buffers:\n{plan:#}"
    );
    let (_, taken) = h
        .store
        .deliveries_finish_then_claim(&[], Some(&c))
        .await
        .expect("claim");
    assert_eq!(taken.len(), 16, "{taken:?}");
    assert!(
        taken.iter().all(|d| run_number(d) >= runs / 2),
        "only runs not leased: {taken:?}"
    );
}

/// `runs` runs of `per_run` events each, committed round by round (every
/// run's first event, then every run's second, …), routed to `hooks` and
/// all claimed, in commit order.
async fn claimed_backlog(
    h: &Harness,
    runs: usize,
    per_run: usize,
    now: i64,
) -> Vec<ClaimedDelivery> {
    commit_backlog(h, runs, per_run).await;
    assert_eq!(route_to_hooks(h, runs * per_run, now).await, runs * per_run);
    let (_, claimed) = h
        .store
        .deliveries_finish_then_claim(&[], Some(&claim(now, runs, per_run)))
        .await
        .expect("claim all");
    assert_eq!(claimed.len(), runs * per_run);
    claimed
}

/// `runs` runs of `per_run` events each, committed round by round, none
/// routed yet.
async fn commit_backlog(h: &Harness, runs: usize, per_run: usize) {
    let mut rows = String::from("INSERT INTO runs (id, pipeline, state, created_at) VALUES ");
    let names: Vec<String> = (0..runs)
        .map(|r| format!("('run-{r}', 'p', 'running', 0)"))
        .collect();
    rows.push_str(&names.join(", "));
    rows.push_str(&format!(
        "; INSERT INTO outbox (dedup_key, run_id, stage, event, payload, created_at)
         SELECT 'run-' || (i % {runs}) || '/' || i, 'run-' || (i % {runs}), 's', 'e', '{{}}', 0
         FROM generate_series(0, {} - 1) AS i ORDER BY i",
        runs * per_run
    ));
    h.raw_sql(&rows).await;
}

/// Recording results on PostgreSQL updates the deliveries in place (HOT
/// updates): the table's indexes do not grow by a byte while 2,048
/// results are recorded, so a result costs one row version and no
/// index entry (migration 0026). Seen failing with the index of pending
/// deliveries partial on `state` again (migration 0026 without its index
/// change): each result wrote an entry in the table's indexes, which grew
/// by 73,728 bytes. An update is in place only while its page has room,
/// and a page makes room by pruning row versions no transaction can see,
/// so the test runs alone among this file's tests (`ALONE`): with them
/// running beside it, their transactions kept old versions, and the
/// indexes grew by up to 81,920 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_results_on_postgres_adds_no_index_entries() {
    let _alone = ALONE.write().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    let (runs, per_run) = (64, 32);
    let claimed = claimed_backlog(&h, runs, per_run, clock.now_ms()).await;
    let finished = delivered_by_run(&claimed, clock.now_ms());

    let pool = sqlx::PgPool::connect(&h.url).await.expect("postgres");
    let size = || sqlx::query_scalar::<_, i64>("SELECT pg_indexes_size('deliveries')");
    let before = size().fetch_one(&pool).await.expect("size");
    // Four runs at a time, as a relay records what its finished lanes
    // sent while the others send.
    for batch in finished.chunks(4 * per_run) {
        record(&h, batch).await;
    }
    let after = size().fetch_one(&pool).await.expect("size");
    pool.close().await;
    assert_eq!(
        after - before,
        0,
        "the indexes grew by {} bytes while {} results were recorded",
        after - before,
        finished.len()
    );
}

/// Recording a relay's batch of results on PostgreSQL reads the deliveries
/// by their keys, however many the table holds: 512 results of 8 runs,
/// recorded after 7,680 others, as a relay records a round while its
/// earlier ones lie delivered. The leases' holders are read once each, by
/// key, and each result is joined to its own.
///
/// Seen failing with the results joined to `deliveries` for their holders
/// (`JOIN deliveries h ON h.id = x.holder`, the statement before this
/// one): estimated small while fresh, the table was walked whole for the
/// holders, once per batch (`Seq Scan` on `deliveries`, 9 of 13 ms of a
/// bench's 582 results at 40,000 events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_results_on_postgres_reads_the_deliveries_by_key() {
    let _beside = ALONE.read().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    let (runs, per_run) = (128, 64);
    let claimed = claimed_backlog(&h, runs, per_run, clock.now_ms()).await;
    let finished = delivered_by_run(&claimed, clock.now_ms());
    let (earlier, batch) = finished.split_at((runs - 8) * per_run);
    for round in earlier.chunks(8 * per_run) {
        record(&h, round).await;
    }

    let pg = PostgresStore::open(&h.url).await.expect("open");
    let plan = pg.explain_delivery_results(batch).await.expect("explain");
    let walks = nodes(&plan[0]["Plan"])
        .into_iter()
        .filter(|n| n["Node Type"] == "Seq Scan" && n["Relation Name"] == "deliveries")
        .count();
    assert_eq!(walks, 0, "the results walked the deliveries:\n{plan:#}");
    assert_eq!(
        plan[0]["Plan"]["Actual Rows"],
        batch.len(),
        "every result recorded:\n{plan:#}"
    );
}

/// Routing a page on PostgreSQL takes its events out of the queue of
/// unrouted ones by key, however long the queue: a relay's page of 2,048
/// of 16,384 queued events, as when a relay starts on a backlog. The page
/// is the queue's lowest ids, and the statement takes every row the queue
/// shows within the page's span of its key, read by key.
///
/// Seen failing with the page looked up by its list alone (`WHERE id =
/// ANY($5)`, the statement before this one): estimated small while fresh,
/// the queue was walked whole for each page (`Seq Scan` on
/// `outbox_unrouted`), so that routing a backlog cost its square. Seen
/// failing too with the span added to that list (`id BETWEEN $6 AND $7
/// AND id = ANY($5)`): the planner costed the list as 2,048 lookups and
/// still walked a queue of this length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_on_postgres_takes_its_page_from_the_queue_by_key() {
    let _beside = ALONE.read().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    commit_backlog(&h, 128, 128).await;
    let routing = hooks_routing(2048, clock.now_ms());

    let pg = PostgresStore::open(&h.url).await.expect("open");
    let plan = pg.explain_routing(&routing).await.expect("explain");
    let all = nodes(&plan[0]["Plan"]);
    let walks = all
        .iter()
        .filter(|n| n["Node Type"] == "Seq Scan" && n["Relation Name"] == "outbox_unrouted")
        .count();
    assert_eq!(walks, 0, "routing walked the queue:\n{plan:#}");
    let taken = all
        .iter()
        .find(|n| n["Operation"] == "Delete" && n["Relation Name"] == "outbox_unrouted")
        .map(|n| n["Actual Rows"].clone());
    assert_eq!(
        taken,
        Some(Value::from(2048)),
        "the whole page taken:\n{plan:#}"
    );
}

/// Counting pending and dead deliveries on PostgreSQL (for each sink, and
/// for the metrics) and listing the pending and the dead letters of every
/// run read what is pending or dead, by key, however many deliveries lie
/// delivered: 128 runs of 64 events, 120 runs delivered, one run's first a
/// dead letter and the rest of it pending, 7 runs pending. The counts and
/// the lists are right, and again once the dead letter is redelivered.
///
/// Seen failing with the statements before migration 0028 (`COUNT(*) FROM
/// deliveries WHERE state = 'pending'`, and `'dead'`; the lists `WHERE
/// d.state = $1`, the pending one until it read the lanes): no index holds
/// deliveries by state (migration 0026), so each walked the whole table
/// (`Seq Scan` on `deliveries`), the counts every scrape of the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_deliveries_on_postgres_reads_only_the_pending_and_the_dead() {
    let _beside = ALONE.read().await;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    let (runs, per_run) = (128, 64);
    let now = clock.now_ms();
    let claimed = claimed_backlog(&h, runs, per_run, now).await;
    let dead = first_of(&claimed, "run-120");
    let finished = finished_by_run(&claimed, now, |d| match run_number(d) {
        _ if d.event.id == dead => DeliveryResult::Dead {
            status: Some(410),
            error: "gone".into(),
        },
        n if n >= 120 => DeliveryResult::Unsent,
        _ => DeliveryResult::Delivered { status: Some(200) },
    });
    for batch in finished.chunks(8 * per_run) {
        record(&h, batch).await;
    }

    let pg = PostgresStore::open(&h.url).await.expect("open");
    for plan in pg.explain_delivery_reports().await.expect("explain") {
        let walks = nodes(&plan[0]["Plan"])
            .into_iter()
            .filter(|n| n["Node Type"] == "Seq Scan" && n["Relation Name"] == "deliveries")
            .count();
        assert_eq!(
            walks, 0,
            "a count or the list walked the deliveries:\n{plan:#}"
        );
    }
    let pending = (per_run - 1) + 7 * per_run;
    let counts = |pending: usize, dead: usize| {
        (
            vec![("hooks".to_string(), pending as i64)],
            pending as i64,
            dead as i64,
        )
    };
    assert_eq!(figures(&h, now).await, counts(pending, 1));
    let unsent = |with_dead: bool| -> Vec<i64> {
        let mut ids: Vec<i64> = claimed
            .iter()
            .filter(|d| run_number(d) >= 120 && (with_dead || d.event.id != dead))
            .map(|d| d.event.id)
            .collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(
        listed_events(&h, DeliveryState::Pending).await,
        unsent(false)
    );
    let dead_letters = listed_rows(&h, DeliveryState::Dead).await;
    let listed: Vec<(i64, Option<&str>)> = dead_letters
        .iter()
        .map(|d| (d.outbox_id, d.last_error.as_deref()))
        .collect();
    assert_eq!(listed, [(dead, Some("gone"))]);
    assert_eq!(
        h.store
            .deliveries_redeliver(Redeliver::AllDead, now)
            .await
            .expect("redeliver"),
        1
    );
    assert_eq!(figures(&h, now).await, counts(pending + 1, 0));
    assert_eq!(
        listed_events(&h, DeliveryState::Pending).await,
        unsent(true)
    );
}

/// Every delivery in `state`, of any run, as `ratchet outbox --state` lists them.
async fn listed_rows(h: &Harness, state: DeliveryState) -> Vec<DeliveryRow> {
    let filter = DeliveryFilter {
        run_id: None,
        state: Some(state),
    };
    h.store.delivery_list(&filter).await.expect("list")
}

/// The events of [`listed_rows`], in the order listed.
async fn listed_events(h: &Harness, state: DeliveryState) -> Vec<i64> {
    let rows = listed_rows(h, state).await;
    rows.iter().map(|d| d.outbox_id).collect()
}

/// Pending deliveries by sink, and the metrics' pending and dead.
async fn figures(h: &Harness, now: i64) -> (Vec<(String, i64)>, i64, i64) {
    let by_sink = h.store.deliveries_pending_by_sink().await.expect("pending");
    let gauges = h.store.queue_gauges(now).await.expect("gauges");
    (by_sink, gauges.deliveries_pending, gauges.deliveries_dead)
}

/// The lowest event id of `run` among `claimed`.
fn first_of(claimed: &[ClaimedDelivery], run: &str) -> i64 {
    claimed
        .iter()
        .filter(|d| d.event.run_id == run)
        .map(|d| d.event.id)
        .min()
        .expect("the run was claimed")
}

/// `claimed` delivered, each run's results together, as a lane's are.
fn delivered_by_run(claimed: &[ClaimedDelivery], now: i64) -> Vec<DeliveryFinish> {
    finished_by_run(claimed, now, |_| DeliveryResult::Delivered {
        status: Some(200),
    })
}

/// `claimed` ended as `result` says, each run's results together.
fn finished_by_run(
    claimed: &[ClaimedDelivery],
    now: i64,
    result: impl Fn(&ClaimedDelivery) -> DeliveryResult,
) -> Vec<DeliveryFinish> {
    let mut by_run: Vec<&ClaimedDelivery> = claimed.iter().collect();
    by_run.sort_by_key(|d| (run_number(d), d.event.id));
    by_run
        .into_iter()
        .map(|d| DeliveryFinish {
            id: d.id,
            relay: "relay".into(),
            lease: d.lease,
            attempts: d.attempts,
            result: result(d),
            now,
        })
        .collect()
}

/// Records `batch` as one transaction of a relay's books does.
async fn record(h: &Harness, batch: &[DeliveryFinish]) {
    let (recorded, _) = h
        .store
        .deliveries_finish_then_claim(batch, None)
        .await
        .expect("record");
    assert!(recorded.iter().all(|r| *r), "every result recorded");
}

/// A plan's node and every node under it.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut all = vec![plan];
    if let Some(children) = plan["Plans"].as_array() {
        all.extend(children.iter().flat_map(nodes));
    }
    all
}

fn run_number(d: &ClaimedDelivery) -> usize {
    d.event.run_id["run-".len()..].parse().expect("run-N")
}

/// Deliveries a relay of the schema before the lanes left pending are
/// claimed after the upgrade: a run's first, and another run's second
/// once its first was delivered; a run whose first is leased is not.
/// Seen failing on PostgreSQL with the migration's lanes left unbuilt: the
/// claim found nothing.
async fn pending_across_upgrade(backend: Backend) {
    let _beside = ALONE.read().await;
    // Routed: SQLite marks the event, PostgreSQL takes it out of a queue.
    let (routed, unqueue) = match backend {
        Backend::Sqlite => (", routed_at", ", 0"),
        Backend::Postgres => ("", ""),
    };
    let mut rows = format!(
        "INSERT INTO runs (id, pipeline, state, created_at)
             VALUES ('a', 'p', 'running', 0), ('b', 'p', 'running', 0), ('c', 'p', 'running', 0);
         INSERT INTO outbox (id, dedup_key, run_id, stage, event, payload, created_at{routed})
             VALUES (1, 'a/1', 'a', 's', 'e', '{{}}', 0{unqueue}),
                    (2, 'a/2', 'a', 's', 'e', '{{}}', 0{unqueue}),
                    (3, 'b/1', 'b', 's', 'e', '{{}}', 0{unqueue}),
                    (4, 'b/2', 'b', 's', 'e', '{{}}', 0{unqueue}),
                    (5, 'c/1', 'c', 's', 'e', '{{}}', 0{unqueue});
         INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                 created_at, lease_owner, lease_expires_at, attempts)
             VALUES (1, 'hooks', 'a', 'pending', 0, 0, 0, NULL, NULL, 0),
                    (2, 'hooks', 'a', 'pending', 0, 0, 0, NULL, NULL, 0),
                    (3, 'hooks', 'b', 'delivered', 0, 0, 0, NULL, NULL, 1),
                    (4, 'hooks', 'b', 'pending', 0, 0, 0, NULL, NULL, 0),
                    (5, 'hooks', 'c', 'pending', 0, 0, 0, 'gone', 9000000000000, 1);"
    );
    if backend == Backend::Postgres {
        rows.push_str("DELETE FROM outbox_unrouted;");
    }
    let Some((_dir, url)) = ratchet_tests::database_at_version(backend, 24, &rows).await else {
        return;
    };
    let clock = Arc::new(ManualClock::new(1_000_000));
    let h = Harness::at_url(url, clock.clone()).await;
    let (_, claimed) = h
        .store
        .deliveries_finish_then_claim(&[], Some(&claim(clock.now_ms(), 8, 16)))
        .await
        .expect("claim");
    let keys: Vec<&str> = claimed.iter().map(|d| d.event.dedup_key.as_str()).collect();
    assert_eq!(keys, ["a/1", "a/2", "b/2"]);
}

/// A dead letter recorded before migration 0028 is counted after it, and
/// redelivered with the others: on PostgreSQL the migration copies it into
/// the dead letters' table. Seen failing with the migration's copy left
/// out: `redeliver --dead` found none.
async fn dead_across_upgrade(backend: Backend) {
    let _beside = ALONE.read().await;
    // Routed: SQLite marks the event, PostgreSQL takes it out of a queue.
    let (column, value, unqueue) = match backend {
        Backend::Sqlite => (", routed_at", ", 0", ""),
        Backend::Postgres => ("", "", "DELETE FROM outbox_unrouted;"),
    };
    let rows = format!(
        "INSERT INTO runs (id, pipeline, state, created_at) VALUES ('a', 'p', 'running', 0);
         INSERT INTO outbox (id, dedup_key, run_id, stage, event, payload, created_at{column})
             VALUES (1, 'a/1', 'a', 's', 'e', '{{}}', 0{value}),
                    (2, 'a/2', 'a', 's', 'e', '{{}}', 0{value});
         INSERT INTO deliveries (outbox_id, sink, run_id, state, next_at, retrying_since,
                                 created_at, attempts, last_error)
             VALUES (1, 'hooks', 'a', 'dead', 0, 0, 0, 3, 'gone'),
                    (2, 'hooks', 'a', 'delivered', 0, 0, 0, 1, NULL);
         {unqueue}"
    );
    let Some((_dir, url)) = ratchet_tests::database_at_version(backend, 27, &rows).await else {
        return;
    };
    let clock = Arc::new(ManualClock::new(1_000_000));
    let h = Harness::at_url(url, clock.clone()).await;
    let now = clock.now_ms();
    assert_eq!(
        figures(&h, now).await,
        (vec![], 0, 1),
        "the dead letter counted"
    );
    let again = h.store.deliveries_redeliver(Redeliver::AllDead, now).await;
    assert_eq!(again.expect("redeliver"), 1);
    assert_eq!(figures(&h, now).await, (vec![("hooks".into(), 1)], 1, 0));
    let (_, claimed) = h
        .store
        .deliveries_finish_then_claim(&[], Some(&claim(now, 8, 16)))
        .await
        .expect("claim");
    let keys: Vec<&str> = claimed.iter().map(|d| d.event.dedup_key.as_str()).collect();
    assert_eq!(keys, ["a/1"]);
}

/// A relay makes claimable, when it starts, pending deliveries whose runs
/// no claim could find: routed without a lane (a relay of the schema
/// before them, still running after the upgrade), or with the lane left
/// empty. Seen failing without the relay's call: the relay, run until
/// nothing is pending, never found the two runs and ran past the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_wakes_runs_no_claim_could_find() {
    let _beside = ALONE.read().await;
    let Some((url, js)) = jetstream().await else {
        return;
    };
    let clock = Arc::new(ratchet_runtime::clock::SystemClock);
    let Some(h) = Harness::on(Backend::Postgres, clock.clone()).await else {
        return;
    };
    commit_chains(&h, 3, &["a.one", "a.two"]).await;
    let routed = route_to_hooks(&h, 100, clock.now_ms()).await;
    h.raw_sql(
        "DELETE FROM delivery_lanes WHERE run_id = 'run-0';
         UPDATE delivery_lanes SET due_at = NULL WHERE run_id = 'run-1';",
    )
    .await;

    let tag = format!("lanes{}", std::process::id());
    let stream = format!("RATCHET_TEST_{tag}");
    let _ = js.delete_stream(&stream).await;
    let text = format!(
        "[[sink]]\nname = \"hooks\"\ntype = \"nats\"\nurl = \"{url}\"\nstream = \"{stream}\"\nsubject = \"test-{tag}.{{event}}\"\ncreate_stream = true\nevents = [\"*\"]\n"
    );
    let sinks = Sinks::parse("sinks.toml", &text).expect("sinks file");
    let mut config = RelayConfig::new("wakes");
    config.poll = std::time::Duration::from_millis(5);
    let relay =
        Relay::new(h.store.clone(), &sinks, &|_| None, clock.clone(), config).expect("relay");
    let relay = Arc::new(relay);
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let stats = tokio::time::timeout(BOUND, relay.run(true, stopped))
        .await
        .expect("nothing pending within the bound")
        .expect("relay ran");
    let delivered = stats.delivered.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(delivered as usize, routed, "{}", stats.summary());
    let _ = js.delete_stream(&stream).await;
}

//! The shared ledger: one Redis server for every instance, each operation one Lua script
//! that Redis runs atomically, so instances can never together hold past a limit.
//!
//! Keys (under a prefix, `switchyard:` by default): `w:<window>` a hash of settled `s`
//! and reserved `r`; `z:<window>` the window's holds by expiry time; `h:<hold>` a hold's
//! amount per window; `done:<hold>` marks a settled hold (a retried settle counts once);
//! `usage` a stream of usage records. A hold expires `hold_ttl` after it was taken
//! (longer than any request may run): a dead instance's holds are then released, not
//! counted, by the next script that touches their window.
//!
//! When Redis cannot be reached an operation fails fast (a reconnect is tried at most
//! every [`RECONNECT_EVERY`]); by default a reservation is then refused (fail closed),
//! with `fail_open` it is let through unheld. Settlements are never dropped: they queue
//! in memory and are replayed, in order, as soon as Redis answers again.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Script;

use super::{now_ms, Hold, HoldId, Ledger, LedgerError, Totals, UsageRecord, WindowId};

/// Gauge: 1 while the shared ledger answers, 0 while it does not.
pub const LEDGER_UP: &str = "switchyard_ledger_up";
/// Counter: ledger operations that failed because the store was unreachable, by `op`.
pub const LEDGER_ERRORS: &str = "switchyard_ledger_errors_total";
/// Counter: reservations let through unheld because the store was down (fail open).
pub const LEDGER_FAIL_OPEN: &str = "switchyard_ledger_fail_open_total";
/// Gauge: settlements waiting in memory for the store to come back.
pub const LEDGER_PENDING: &str = "switchyard_ledger_pending_settlements";

/// How long a connect or a command may take before the store counts as down.
const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// While the store is down, how often an operation tries to reconnect (the others fail
/// at once rather than each waiting for a timeout).
pub const RECONNECT_EVERY: Duration = Duration::from_millis(500);
/// Most settlements kept while the store is down (the oldest are logged and dropped
/// past that, so an outage cannot exhaust memory).
const MAX_PENDING: usize = 100_000;
/// How long windows are kept after they end (for audits), in seconds.
const KEEP_WINDOWS_SECS: u64 = 7 * 24 * 3600;

/// How to reach and use the shared store.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://HOST:PORT[/DB]`.
    pub url: String,
    /// Let reservations through unheld while the store is down (default: refuse them).
    pub fail_open: bool,
    /// How long a hold lives without being settled or released.
    pub hold_ttl: Duration,
    /// Prefix of every key.
    pub prefix: String,
}

impl RedisOptions {
    /// Fail closed, 15-minute holds, prefix `switchyard:`.
    pub fn new(url: impl Into<String>) -> Self {
        RedisOptions {
            url: url.into(),
            fail_open: false,
            hold_ttl: Duration::from_secs(15 * 60),
            prefix: "switchyard:".to_owned(),
        }
    }
}

/// Counters in a Redis server shared by every instance.
pub struct RedisLedger {
    options: RedisOptions,
    client: redis::Client,
    link: Mutex<Link>,
    pending: Mutex<VecDeque<Pending>>,
    reserve: Script,
    settle: Script,
    totals: Script,
}

struct Link {
    connection: Option<redis::Connection>,
    /// When the last connect attempt failed (none: up or never tried).
    down_since: Option<Instant>,
    last_attempt: Option<Instant>,
}

struct Pending {
    id: HoldId,
    spent: Vec<(WindowId, f64)>,
    usage: Option<String>,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("options", &self.options)
            .finish()
    }
}

fn unavailable(error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Unavailable {
        store: "redis",
        reason: error.to_string(),
    }
}

/// Purges expired holds of window `sk`, then checks and applies each hold; returns
/// `{-1, "0"}` or `{index of the first hold that does not fit, remaining}`.
const RESERVE: &str = r#"
local id, now, expire, p = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local hk = p .. 'h:' .. id
local n = (#ARGV - 4) / 4
local function purge(sk)
  local wk, zk = p .. 'w:' .. sk, p .. 'z:' .. sk
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', zk, '-inf', now)) do
    local a = tonumber(redis.call('HGET', p .. 'h:' .. m, sk) or '0')
    redis.call('HINCRBYFLOAT', wk, 'r', -a)
    redis.call('HDEL', p .. 'h:' .. m, sk)
    redis.call('ZREM', zk, m)
  end
end
for j = 1, n do
  local b = 4 + (j - 1) * 4
  local sk, limit, amount = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  purge(sk)
  local wk = p .. 'w:' .. sk
  local s = tonumber(redis.call('HGET', wk, 's') or '0')
  local r = tonumber(redis.call('HGET', wk, 'r') or '0')
  local mine = tonumber(redis.call('HGET', hk, sk) or '0')
  local remaining = limit - s - (r - mine)
  if amount > remaining + 1e-9 then
    return {j - 1, tostring(math.max(remaining, 0))}
  end
end
for j = 1, n do
  local b = 4 + (j - 1) * 4
  local sk, amount, ends = ARGV[b + 1], tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
  local wk, zk = p .. 'w:' .. sk, p .. 'z:' .. sk
  local mine = tonumber(redis.call('HGET', hk, sk) or '0')
  redis.call('HINCRBYFLOAT', wk, 'r', amount - mine)
  redis.call('HSET', hk, sk, amount)
  redis.call('ZADD', zk, expire, id)
  redis.call('EXPIREAT', wk, ends)
  redis.call('EXPIREAT', zk, ends)
end
redis.call('PEXPIREAT', hk, expire + 60000)
return {-1, '0'}
"#;

/// Returns a hold's amounts (a release when no spend follows), settles the spend once
/// per hold id and appends the usage record.
const SETTLE: &str = r#"
local id, p, usage = ARGV[1], ARGV[2], ARGV[3]
local done = p .. 'done:' .. id
if redis.call('EXISTS', done) == 1 then return 0 end
local hk = p .. 'h:' .. id
local held = redis.call('HGETALL', hk)
for i = 1, #held, 2 do
  redis.call('HINCRBYFLOAT', p .. 'w:' .. held[i], 'r', -tonumber(held[i + 1]))
  redis.call('ZREM', p .. 'z:' .. held[i], id)
end
redis.call('DEL', hk)
local n = (#ARGV - 3) / 3
for j = 1, n do
  local b = 3 + (j - 1) * 3
  local wk = p .. 'w:' .. ARGV[b + 1]
  redis.call('HINCRBYFLOAT', wk, 's', tonumber(ARGV[b + 2]))
  redis.call('EXPIREAT', wk, tonumber(ARGV[b + 3]))
end
if n > 0 or usage ~= '' then
  redis.call('SET', done, '1', 'EX', 86400)
end
if usage ~= '' then
  redis.call('XADD', p .. 'usage', '*', 'r', usage)
end
return 1
"#;

/// Purges expired holds of a window and returns its settled and reserved amounts.
const TOTALS: &str = r#"
local p, sk, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local wk, zk = p .. 'w:' .. sk, p .. 'z:' .. sk
for _, m in ipairs(redis.call('ZRANGEBYSCORE', zk, '-inf', now)) do
  local a = tonumber(redis.call('HGET', p .. 'h:' .. m, sk) or '0')
  redis.call('HINCRBYFLOAT', wk, 'r', -a)
  redis.call('HDEL', p .. 'h:' .. m, sk)
  redis.call('ZREM', zk, m)
end
return {redis.call('HGET', wk, 's') or '0', redis.call('HGET', wk, 'r') or '0'}
"#;

/// Unix seconds until which Redis keeps a window's keys: a while after it ends, and
/// never past ten years from now (Redis takes 64-bit times, Lua's numbers lose digits
/// past 2^53).
fn keep_until(window: &WindowId) -> u64 {
    let now = now_ms() / 1000;
    window
        .ends_at
        .saturating_add(KEEP_WINDOWS_SECS)
        .min(now.saturating_add(10 * 365 * 24 * 3600))
}

impl RedisLedger {
    /// A ledger over `options.url`. Only the URL is checked here: the server may come up
    /// later (operations fail, as documented, until it does).
    pub fn new(options: RedisOptions) -> Result<Self, LedgerError> {
        let client =
            redis::Client::open(options.url.as_str()).map_err(|e| LedgerError::Unavailable {
                store: "redis",
                reason: format!(
                    "`{}` is not a Redis URL (redis://HOST:PORT[/DB]): {e}",
                    options.url
                ),
            })?;
        let ledger = RedisLedger {
            options,
            client,
            link: Mutex::new(Link {
                connection: None,
                down_since: None,
                last_attempt: None,
            }),
            pending: Mutex::new(VecDeque::new()),
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            totals: Script::new(TOTALS),
        };
        // Connect now so that a wrong address shows in the first log lines.
        let _ = ledger.with_connection("connect", |_| Ok(()));
        Ok(ledger)
    }

    /// Runs `op` on the connection, connecting first if needed; a failure drops the
    /// connection and marks the store down. Replays queued settlements first.
    fn with_connection<T>(
        &self,
        op: &'static str,
        body: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, LedgerError> {
        let mut link = self.link.lock().unwrap_or_else(|e| e.into_inner());
        if link.connection.is_none() {
            if let (Some(_), Some(last)) = (link.down_since, link.last_attempt) {
                if last.elapsed() < RECONNECT_EVERY {
                    metrics::counter!(LEDGER_ERRORS, "op" => op).increment(1);
                    return Err(unavailable("Redis is down; reconnecting"));
                }
            }
            link.last_attempt = Some(Instant::now());
            match self.connect() {
                Ok(connection) => {
                    if let Some(since) = link.down_since.take() {
                        tracing::warn!(
                            url = %self.options.url,
                            down_for_ms = since.elapsed().as_millis() as u64,
                            "spend ledger: Redis is reachable again"
                        );
                    }
                    metrics::gauge!(LEDGER_UP).set(1.0);
                    link.connection = Some(connection);
                }
                Err(error) => {
                    self.mark_down(&mut link, op, &error);
                    return Err(unavailable(error));
                }
            }
        }
        let Some(connection) = link.connection.as_mut() else {
            return Err(unavailable("no connection"));
        };
        if let Err(error) = self.replay(connection) {
            self.mark_down(&mut link, op, &error);
            return Err(unavailable(error));
        }
        match body(connection) {
            Ok(out) => Ok(out),
            Err(error) => {
                self.mark_down(&mut link, op, &error);
                Err(unavailable(error))
            }
        }
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let connection = self.client.get_connection_with_timeout(IO_TIMEOUT)?;
        connection.set_read_timeout(Some(IO_TIMEOUT))?;
        connection.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(connection)
    }

    fn mark_down(&self, link: &mut Link, op: &'static str, error: &dyn std::fmt::Display) {
        link.connection = None;
        if link.down_since.is_none() {
            link.down_since = Some(Instant::now());
            tracing::error!(
                url = %self.options.url,
                %error,
                fail_open = self.options.fail_open,
                "spend ledger: Redis is unreachable; {}",
                if self.options.fail_open {
                    "budgeted requests are let through unheld (fail open) until it is back"
                } else {
                    "budgeted requests are refused with 503 (fail closed) until it is back"
                }
            );
        }
        metrics::gauge!(LEDGER_UP).set(0.0);
        metrics::counter!(LEDGER_ERRORS, "op" => op).increment(1);
    }

    /// Sends the settlements queued during an outage, oldest first.
    fn replay(&self, connection: &mut redis::Connection) -> redis::RedisResult<()> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(next) = pending.front() {
            self.settle_script(connection, next.id, &next.spent, next.usage.as_deref())?;
            pending.pop_front();
            metrics::gauge!(LEDGER_PENDING).set(pending.len() as f64);
        }
        Ok(())
    }

    fn settle_script(
        &self,
        connection: &mut redis::Connection,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&str>,
    ) -> redis::RedisResult<()> {
        let mut call = self.settle.prepare_invoke();
        call.arg(id.to_string())
            .arg(&self.options.prefix)
            .arg(usage.unwrap_or(""));
        for (window, amount) in spent {
            call.arg(window.storage_key())
                .arg(*amount)
                .arg(keep_until(window));
        }
        call.invoke::<i64>(connection).map(drop)
    }

    fn hold(&self, op: &'static str, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        let now = now_ms();
        let ttl = u64::try_from(self.options.hold_ttl.as_millis()).unwrap_or(u64::MAX);
        let result = self.with_connection(op, |connection| {
            let mut call = self.reserve.prepare_invoke();
            call.arg(id.to_string())
                .arg(now)
                .arg(now.saturating_add(ttl))
                .arg(&self.options.prefix);
            for hold in holds {
                call.arg(hold.window.storage_key())
                    .arg(hold.limit)
                    .arg(hold.amount)
                    .arg(keep_until(&hold.window));
            }
            call.invoke::<(i64, String)>(connection)
        });
        match result {
            Ok((-1, _)) => Ok(()),
            Ok((hold, remaining)) => Err(LedgerError::Short {
                hold: usize::try_from(hold).unwrap_or(0),
                remaining: remaining.parse().unwrap_or(0.0),
            }),
            Err(_) if self.options.fail_open => {
                metrics::counter!(LEDGER_FAIL_OPEN).increment(1);
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

impl Ledger for RedisLedger {
    fn reserve(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        self.hold("reserve", id, holds)
    }

    fn resize(&self, id: HoldId, holds: &[Hold]) -> Result<(), LedgerError> {
        self.hold("resize", id, holds)
    }

    fn settle(
        &self,
        id: HoldId,
        spent: &[(WindowId, f64)],
        usage: Option<&UsageRecord>,
    ) -> Result<(), LedgerError> {
        let usage = usage
            .map(serde_json::to_string)
            .transpose()
            .map_err(unavailable)?;
        let result = self.with_connection("settle", |connection| {
            self.settle_script(connection, id, spent, usage.as_deref())
        });
        if result.is_err() {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() >= MAX_PENDING {
                if let Some(lost) = pending.pop_front() {
                    tracing::error!(
                        hold = lost.id,
                        "spend ledger: too many settlements waiting for Redis; dropped the oldest"
                    );
                }
            }
            pending.push_back(Pending {
                id,
                spent: spent.to_vec(),
                usage,
            });
            metrics::gauge!(LEDGER_PENDING).set(pending.len() as f64);
        }
        Ok(())
    }

    fn release(&self, id: HoldId) -> Result<(), LedgerError> {
        // A release that cannot reach Redis is left to the hold's expiry.
        self.with_connection("release", |connection| {
            self.settle_script(connection, id, &[], None)
        })
    }

    fn totals(&self, window: &WindowId) -> Result<Totals, LedgerError> {
        let (settled, reserved): (String, String) =
            self.with_connection("totals", |connection| {
                self.totals
                    .prepare_invoke()
                    .arg(&self.options.prefix)
                    .arg(window.storage_key())
                    .arg(now_ms())
                    .invoke(connection)
            })?;
        Ok(Totals {
            settled: settled.parse().unwrap_or(0.0),
            reserved: reserved.parse::<f64>().unwrap_or(0.0).max(0.0),
        })
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn usage_since(&self, since_ms: u64, limit: usize) -> Result<Vec<UsageRecord>, LedgerError> {
        let key = format!("{}usage", self.options.prefix);
        let entries: Vec<(String, Vec<(String, String)>)> =
            self.with_connection("usage", |connection| {
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(since_ms)
                    .arg("+")
                    .arg("COUNT")
                    .arg(limit)
                    .query(connection)
            })?;
        Ok(entries
            .into_iter()
            .flat_map(|(_, fields)| fields)
            .filter_map(|(_, json)| serde_json::from_str::<UsageRecord>(&json).ok())
            // Stream ids are Redis's clock; the records carry the instance's.
            .filter(|record| record.time_ms >= since_ms)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;

    use super::*;

    /// A `redis-server` of its own on a loopback port (Debian's package; see
    /// scripts/setup.sh), stopped when dropped.
    struct Server {
        child: Child,
        port: u16,
        _dir: tempfile::TempDir,
    }

    impl Server {
        fn start_on(port: u16) -> Server {
            let dir = tempfile::tempdir().unwrap();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                ])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server is not installed: run scripts/setup.sh");
            // A guard against a hang: it starts in milliseconds on an idle machine.
            let deadline = Instant::now() + Duration::from_secs(60);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            Server {
                child,
                port,
                _dir: dir,
            }
        }

        fn start() -> Server {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            Server::start_on(port)
        }

        fn ledger(&self, fail_open: bool, ttl: Duration) -> RedisLedger {
            let mut options = RedisOptions::new(format!("redis://127.0.0.1:{}/0", self.port));
            options.fail_open = fail_open;
            options.hold_ttl = ttl;
            RedisLedger::new(options).unwrap()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn window() -> WindowId {
        WindowId {
            key: format!("test:{}", super::super::new_hold_id()).into(),
            index: 1,
            ends_at: 4_000_000_000,
        }
    }

    fn hold(window: &WindowId, limit: f64, amount: f64) -> Hold {
        Hold {
            window: window.clone(),
            limit,
            amount,
        }
    }

    #[test]
    fn redis_ledger_keeps_the_contract() {
        let server = Server::start();
        super::super::contract::check(&server.ledger(false, Duration::from_secs(60)));
    }

    #[test]
    fn instances_together_never_hold_past_the_limit() {
        let server = Server::start();
        let ledgers: Vec<Arc<RedisLedger>> = (0..3)
            .map(|_| Arc::new(server.ledger(false, Duration::from_secs(60))))
            .collect();
        let w = window();
        let taken: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..30)
                .map(|i| {
                    let ledger = Arc::clone(&ledgers[i % 3]);
                    let w = w.clone();
                    scope.spawn(move || {
                        ledger
                            .reserve(super::super::new_hold_id(), &[hold(&w, 100.0, 10.0)])
                            .is_ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| usize::from(h.join().unwrap()))
                .sum()
        });
        assert_eq!(taken, 10);
        assert_eq!(ledgers[0].totals(&w).unwrap().reserved, 100.0);
    }

    #[test]
    fn holds_of_a_dead_instance_expire() {
        let server = Server::start();
        let live = server.ledger(false, Duration::from_secs(60));
        // The dead instance's hold lives `ttl` by Redis's clock. The live instance's
        // refusal is judged only in a round that ended within `ttl` of the hold being
        // taken; a round the host stretched past it (a descheduled thread) proves
        // nothing and runs again on a fresh window.
        let ttl = Duration::from_millis(100);
        let mut rounds = 0;
        let (w, dead_hold, live_hold) = loop {
            rounds += 1;
            assert!(rounds <= 100, "no round ran within {ttl:?}");
            let (dead_hold, live_hold) = (super::super::new_hold_id(), super::super::new_hold_id());
            let w = window();
            let dead = server.ledger(false, ttl);
            let taking = Instant::now();
            dead.reserve(dead_hold, &[hold(&w, 100.0, 80.0)])
                .expect("the store is up");
            drop(dead);
            let refused = live.reserve(live_hold, &[hold(&w, 100.0, 80.0)]).is_err();
            if taking.elapsed() < ttl {
                assert!(refused, "the dead instance's hold was not counted");
                break (w, dead_hold, live_hold);
            }
        };
        std::thread::sleep(ttl * 2);
        live.reserve(live_hold, &[hold(&w, 100.0, 80.0)]).unwrap();
        // A late settle of the expired hold still counts its spend, once.
        live.settle(dead_hold, &[(w.clone(), 5.0)], None).unwrap();
        live.settle(dead_hold, &[(w.clone(), 5.0)], None).unwrap();
        assert_eq!(
            live.totals(&w).unwrap(),
            Totals {
                settled: 5.0,
                reserved: 80.0
            }
        );
    }

    #[test]
    fn an_outage_fails_closed_queues_settlements_and_recovers() {
        let server = Server::start();
        let port = server.port;
        let w = window();
        let ledger = server.ledger(false, Duration::from_secs(60));
        ledger.reserve(1, &[hold(&w, 100.0, 10.0)]).unwrap();
        drop(server);
        let refused = ledger.reserve(2, &[hold(&w, 100.0, 10.0)]);
        assert!(
            matches!(refused, Err(LedgerError::Unavailable { .. })),
            "{refused:?}"
        );
        // A request that ran during the outage is settled once Redis is back.
        ledger.settle(1, &[(w.clone(), 7.0)], None).unwrap();
        // A down store fails fast (no wait for a timeout): the fastest of five calls,
        // so that one call the host descheduled cannot fail the test.
        let fastest = (0..5)
            .map(|_| {
                let started = Instant::now();
                assert!(ledger.totals(&w).is_err());
                started.elapsed()
            })
            .min()
            .expect("five calls");
        assert!(
            fastest < Duration::from_millis(100),
            "a down store took {fastest:?} to fail"
        );
        let _back = Server::start_on(port);
        std::thread::sleep(RECONNECT_EVERY);
        assert_eq!(ledger.totals(&w).unwrap().settled, 7.0);
        let open = _back.ledger(true, Duration::from_secs(60));
        drop(_back);
        assert!(
            open.reserve(3, &[hold(&w, 1.0, 10.0)]).is_ok(),
            "fail open lets it through"
        );
    }
}

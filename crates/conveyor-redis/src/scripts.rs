//! The Lua scripts that keep a queue's multi-key steps atomic.

use std::sync::LazyLock;

use redis::Script;

/// Moves up to `ARGV[2]` delayed messages due by `ARGV[1]` (ms) from the sorted set
/// `KEYS[2]` (their fields in hashes `ARGV[3]<id>`) into the stream `KEYS[1]`; answers
/// when the next one is due (ms), or -1.
pub(crate) static MOVE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
  local held = ARGV[3] .. id
  local fields = redis.call('HGETALL', held)
  if #fields > 0 then redis.call('XADD', KEYS[1], '*', unpack(fields)) end
  redis.call('DEL', held)
  redis.call('ZREM', KEYS[2], id)
end
local next = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #next == 0 then return -1 end
return tonumber(next[2])
",
    )
});

/// Renews the leases of the entries `ARGV[3..]` of stream `KEYS[1]`, group `ARGV[1]`,
/// that consumer `ARGV[2]` still holds (their idle time back to zero, their delivery
/// count untouched); answers 1 per entry renewed, 0 per entry another consumer took or
/// that is gone.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local renewed = {}
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #pending == 1 and pending[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    renewed[#renewed + 1] = 1
  else
    renewed[#renewed + 1] = 0
  end
end
return renewed
",
    )
});

/// Puts entry `ARGV[2]` of stream `KEYS[1]` (group `ARGV[1]`) back for a retry at
/// `ARGV[3]` (ms): its fields, with `attempts` = `ARGV[6]`, into the hash `ARGV[4]<ARGV[5]>`
/// and the sorted set `KEYS[2]`, then acknowledges and deletes the entry.
pub(crate) static RETRY_LATER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local entry = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #entry == 0 then return 0 end
local held = ARGV[4] .. ARGV[5]
redis.call('HSET', held, unpack(entry[1][2]))
redis.call('HSET', held, 'attempts', ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
",
    )
});

/// Removes consumer `ARGV[2]` from group `ARGV[1]` of stream `KEYS[1]` if it holds no
/// entry (deleting a consumer makes the entries it holds unclaimable); answers 1 if it was
/// removed, 0 if it holds some and stays.
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
",
    )
});

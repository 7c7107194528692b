package cache

import (
	"crypto/sha1"
	"encoding/hex"
)

// Lua scripts of RedisStore. Each touches the keys of one entry (one slot)
// or one tag index, never both, so they run unchanged on Redis Cluster
// (which is why a read checks an entry's tag indexes in its pipeline, not
// in a script: see RedisStore).
// Time is the server's (TIME). Integers passed back to Redis go through
// string.format('%d'), since Redis may render a Lua number in exponent form.

// luaLib is prepended to every script.
const luaLib = `
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- bump raises the fence to max(fence + 1, server time in µs): fences only
-- grow, even across the fence key expiring.
local function bump(key, ttl_ms)
  local f = redis.call('INCR', key)
  local now = now_us()
  if f < now then
    f = now
    redis.call('SET', key, string.format('%d', f))
  end
  redis.call('PEXPIRE', key, ttl_ms)
  return f
end
-- publish wakes the entry's waiters: sharded pub/sub (Redis 7+) keeps the
-- message on the entry's node in a cluster; older servers fall back to
-- PUBLISH (waiters then poll).
local function publish(ch, msg)
  if not pcall(redis.call, 'SPUBLISH', ch, msg) then
    redis.call('PUBLISH', ch, msg)
  end
end
-- stale_ms reads the stale window from a blob's header; nil for a blob
-- this version does not serve (see decodeBlob: another version, or one
-- without flagTagsKnown, whose tag indexes are unknown).
local function stale_ms(v)
  if string.len(v) < 18 then
    return nil
  end
  local ver, flags = string.byte(v, 1, 2)
  if (ver ~= 1 and ver ~= 2) or math.floor(flags / 2) % 2 ~= 1 then
    return nil
  end
  local a, b, c, d = string.byte(v, 15, 18)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
`

// acquireSrc is get-or-lock.
//
//	KEYS: entry, lock, fence
//	ARGV: token, lock ms, fence ms, mode ("m" miss, "r" refresh), fence seen (8 bytes, refresh)
//	reply: {0, blob, pttl}  fresh value (miss)
//	       {1, fence}       lock taken
//	       {2, lock pttl}   lock held by another loader
//	       {3}              refresh: the value changed or is gone
const acquireSrc = luaLib + `
local v = redis.call('GET', KEYS[1])
if ARGV[4] == 'm' then
  if v then
    local s = stale_ms(v)
    local pttl = redis.call('PTTL', KEYS[1])
    if s and (pttl == -1 or pttl > s) then
      return {0, v, pttl}
    end
  end
elseif not v or string.sub(v, 3, 10) ~= ARGV[5] then
  return {3}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, bump(KEYS[3], ARGV[3])}
end
return {2, redis.call('PTTL', KEYS[2])}
`

// commitSrc stores a loaded value if its fence is still current (no lock
// was granted and no invalidation happened since), releases the lock if
// still ours, and wakes the waiters either way. An empty blob is a value
// the store does not keep (RedisOptions.MaxValueBytes): the entry's value
// is deleted instead, as the newer load replaces it.
//
//	KEYS: entry, lock, fence
//	ARGV: token, fence, blob ('': not kept), px, channel
//	reply: 1 stored, 2 not kept, 0 refused
const commitSrc = luaLib + `
local ok = 0
if redis.call('GET', KEYS[3]) == ARGV[2] then
  if ARGV[3] == '' then
    redis.call('DEL', KEYS[1])
    ok = 2
  else
    redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
    ok = 1
  end
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
end
publish(ARGV[5], ok == 1 and 'v' or 'r')
return ok
`

// releaseSrc is compare-and-delete of the lock; it wakes the waiters so
// that one of them takes the lock at once.
//
//	KEYS: lock
//	ARGV: token, channel
const releaseSrc = luaLib + `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  publish(ARGV[2], 'r')
  return 1
end
return 0
`

// dropSrc deletes an entry and bumps its fence if a load may be in flight
// (the fence key exists), so that load cannot store what it read.
//
//	KEYS: entry, fence
//	ARGV: fence ms
const dropSrc = luaLib + `
local n = redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then
  bump(KEYS[2], ARGV[1])
end
return n
`

// dropUnlistedSrc deletes an entry that a tag index it was registered in
// no longer lists (the index was evicted, or the membership ended), if it
// is still the value the reader saw (fence seen): an invalidation through
// that index cannot find it, so it must not be served, nor returned fresh
// by acquireSrc after the acquire registered it again.
//
//	KEYS: entry
//	ARGV: fence seen (8 bytes)
//	reply: 1 deleted, 0 already gone or replaced
const dropUnlistedSrc = `
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 3, 10) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`

// tagSrc adds an entry to a tag index scored by when the membership ends,
// prunes ended memberships, and keeps the index's TTL at its last one. It
// replies whether the index listed the entry before (see acquireChecked).
//
//	KEYS: tag index
//	ARGV: entry key, life ms
//	reply: 1 listed before, 0 not (new, ended, or the index was lost)
const tagSrc = luaLib + `
local now = math.floor(now_us() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now))
local exp = now + tonumber(ARGV[2])
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) < exp then
  redis.call('ZADD', KEYS[1], string.format('%d', exp), ARGV[1])
end
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(top[2]) - now + 1))
return cur and 1 or 0
`

// drainSrc moves a tag index aside whole, into its drain key (merged with
// what an earlier invalidation left there), prunes ended memberships, and
// returns the drain's first page. One command whatever the index's size:
// from then on no read serves the index's entries (they are unlisted, as
// after the index's eviction), and the drain is emptied a page at a time
// (pageSrc), each page's entries dropped before their memberships go.
//
//	KEYS: tag index, its drain
//	ARGV: page length
const drainSrc = luaLib + `
local now = string.format('%d', math.floor(now_us() / 1000))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('ZUNIONSTORE', KEYS[2], 2, KEYS[2], KEYS[1], 'AGGREGATE', 'MAX')
    redis.call('DEL', KEYS[1])
  else
    redis.call('RENAME', KEYS[1], KEYS[2])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if top[2] then
  redis.call('PEXPIRE', KEYS[2], string.format('%d', tonumber(top[2]) - tonumber(now) + 1))
end
return redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1)
`

// pageSrc removes the memberships of entries dropped from a drain and
// returns its next page (empty once drained).
//
//	KEYS: drain
//	ARGV: page length, entry keys dropped...
const pageSrc = `
if #ARGV > 1 then
  redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
end
return redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
`

// script is a Lua script run by EVALSHA, and by EVAL after NOSCRIPT.
type script struct {
	src, sha string
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

var (
	acquireScript  = newScript(acquireSrc)
	commitScript   = newScript(commitSrc)
	releaseScript  = newScript(releaseSrc)
	dropScript     = newScript(dropSrc)
	tagScript      = newScript(tagSrc)
	unlistedScript = newScript(dropUnlistedSrc)
	drainScript    = newScript(drainSrc)
	pageScript     = newScript(pageSrc)
)

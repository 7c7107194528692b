package cache

import (
	"context"
	"slices"

	"github.com/redis/rueidis"
)

// This file is RedisStore's check that an entry is still listed by its tag
// indexes (see RedisStore): on read, and on acquire (acquireChecked).

// read gets the entry and its PTTL and, in the same pipeline, asks each
// index of the caller's tags (the ones the entry most likely records)
// whether it lists the entry; indexes the record names beyond those take
// a second round trip. An entry that one of its indexes no longer lists
// (see RedisStore), or that records none of an index of the caller's
// (see checkListed), is deleted, if unchanged, and read as absent.
func (r *RedisStore) read(ctx context.Context, key Key, tags []string) (record, bool, error) {
	entry := key.entry
	cmds := make(rueidis.Commands, 2, 2+len(tags))
	cmds[0] = r.client.B().Get().Key(entry).Build()
	cmds[1] = r.client.B().Pttl().Key(entry).Build()
	hint := tagKeys(key.scope, tags)
	for _, tk := range hint {
		cmds = append(cmds, r.client.B().Zscore().Key(tk).Member(entry).Build())
	}
	res := r.client.DoMulti(ctx, cmds...)
	b, err := res[0].AsBytes()
	if rueidis.IsRedisNil(err) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	pttl, err := res[1].AsInt64()
	if err != nil {
		return record{}, false, err
	}
	life, ok := lifeOf(pttl)
	if !ok {
		return record{}, false, nil
	}
	rec, ok := decodeBlob(b, life)
	if !ok || len(rec.tags) == 0 && len(hint) == 0 {
		return rec, ok, nil
	}
	listed, err := r.checkListed(ctx, entry, &rec, hint, func(j int) (bool, error) { return isListed(res[2+j]) })
	if !listed || err != nil {
		return record{}, false, err
	}
	return rec, true, nil
}

// isListed reads a ZSCORE reply: whether the index lists the member.
func isListed(res rueidis.RedisResult) (bool, error) {
	err := res.Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	return err == nil, err
}

// dropUnlisted deletes entry, read with fence, which one of its tag
// indexes does not list. A failed deletion is an error, so that the caller
// loads without the store: acquire would register the entry again and
// return it as fresh.
func (r *RedisStore) dropUnlisted(ctx context.Context, entry string, fence uint64) error {
	return r.run(ctx, []scriptCall{{unlistedScript, []string{entry}, []string{fenceBytes(fence)}}})[0].Error()
}

// checkListed reports whether every tag index rec names lists entry, and
// rec names every one of keys, the indexes of the caller's policy: known(j)
// answers for keys[j] (from a reply already in hand), and the indexes rec
// names beyond keys are asked now, in one round trip. When rec lacks one
// of keys (it was loaded under other tags, before a config reload added
// one) or an index does not list it, rec is deleted if unchanged
// (dropUnlisted); when an answer is an error, that error is returned and
// nothing is deleted. A record that lacks one of keys is not in that
// index unless an acquire of the new policy put it there since, so an
// invalidation of the tag may have missed it.
func (r *RedisStore) checkListed(ctx context.Context, entry string, rec *record, keys []string, known func(j int) (bool, error)) (bool, error) {
	if !covers(rec.tags, keys) {
		return false, r.dropUnlisted(ctx, entry, rec.fence)
	}
	var rest []string
	for _, k := range rec.tags {
		j := slices.Index(keys, k)
		if j < 0 {
			rest = append(rest, k)
			continue
		}
		if listed, err := known(j); err != nil || !listed {
			if err == nil { // a failed check deletes nothing
				err = r.dropUnlisted(ctx, entry, rec.fence)
			}
			return false, err
		}
	}
	if len(rest) == 0 {
		return true, nil
	}
	cmds := make(rueidis.Commands, len(rest))
	for i, k := range rest {
		cmds[i] = r.client.B().Zscore().Key(k).Member(entry).Build()
	}
	for _, res := range r.client.DoMulti(ctx, cmds...) {
		if listed, err := isListed(res); err != nil || !listed {
			if err == nil { // a failed check deletes nothing
				err = r.dropUnlisted(ctx, entry, rec.fence)
			}
			return false, err
		}
	}
	return true, nil
}

package cache

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/testenv"
)

// benchHit measures the hit path: a Get of a fresh entry, from many
// goroutines, the entry tagged tags.
func benchHit(b *testing.B, s Store, tags ...string) {
	// A generous timeout: on a loaded machine one read past the 100ms
	// default would count as a miss.
	c, err := New(s, &Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	k := mustKey(b, Tenant("acme"), "search", `{"query":"pricing","limit":10}`)
	value := []byte(`{"content":[{"type":"text","text":"` + string(make([]byte, 0, 512)) + `plans start at $10"}]}`)
	load := func(context.Context) ([]byte, bool, error) { return value, false, nil }
	pol := Policy{TTL: time.Hour, Tags: tags}
	if _, _, err := c.Get(context.Background(), k, load, pol); err != nil {
		b.Fatal(err)
	}
	if _, local := s.(*MemoryStore); !local {
		// Many callers in flight, as behind a busy gateway: rueidis
		// pipelines their reads.
		b.SetParallelism(8)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, src, err := c.Get(ctx, k, load, pol); err != nil || src != Hit {
				b.Errorf("Get: %v %v", src, err)
				return
			}
		}
	})
	b.StopTimer()
	if st := c.Stats(); st.Loads != 1 {
		b.Fatalf("%d loads during the benchmark", st.Loads)
	}
}

func BenchmarkGetHit(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		s, err := NewMemoryStore(nil)
		if err != nil {
			b.Fatal(err)
		}
		benchHit(b, s)
	})
	// A tagged entry: a hit also checks that it was stored under the
	// policy's tags.
	b.Run("memory-tagged", func(b *testing.B) {
		s, err := NewMemoryStore(nil)
		if err != nil {
			b.Fatal(err)
		}
		benchHit(b, s, "product:42", "region:eu")
	})
	b.Run("redis", func(b *testing.B) {
		r := testenv.StartRedis(b, nil)
		benchHit(b, mustRedisStore(b, r.Client(b)))
	})
	// A tagged entry: a hit also checks that the tag indexes still list it.
	b.Run("redis-tagged", func(b *testing.B) {
		r := testenv.StartRedis(b, nil)
		benchHit(b, mustRedisStore(b, r.Client(b)), "product:42", "region:eu")
	})
}

// BenchmarkNewKey measures building a key from raw arguments: canonical
// JSON, SHA-256, escaping.
func BenchmarkNewKey(b *testing.B) {
	args := json.RawMessage(`{"query": "pricing", "filters": {"region": "eu", "tier": [1, 2.0, 3e0]}, "limit": 10}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewKey(Tenant("acme"), "search", args); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRenderTags measures rendering compiled tag templates.
func BenchmarkRenderTags(b *testing.B) {
	tags, err := CompileTags([]string{"product:{{args.id}}", "region:{{args.filters.region}}"})
	if err != nil {
		b.Fatal(err)
	}
	args := json.RawMessage(`{"id": 42, "filters": {"region": "eu"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tags.Render(args); err != nil {
			b.Fatal(err)
		}
	}
}

package fleetstate

import (
	"context"
	"testing"
	"time"

	"github.com/forkbox/forkbox/store"
)

// BenchmarkQuotaHold measures one admission's fleet hold and its release
// (two compare-and-set writes) on a real three-node cluster, against a
// plain KV put of the same entry (the floor).
func BenchmarkQuotaHold(b *testing.B) {
	hosts := startHosts(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	q, err := OpenQuotas(ctx, hosts[0].f, quietLog())
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hold+release", func(b *testing.B) {
		n := 0
		for b.Loop() {
			if _, err := q.Hold(context.Background(), "sessions", "acme", 1, func() int { return n + 1 }, func() { n++ }); err != nil {
				b.Fatal(err)
			}
			n--
			if err := q.Sync(context.Background(), "sessions", "acme", func() int { return n }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kv-put-floor", func(b *testing.B) {
		for b.Loop() {
			if _, err := q.kv.Put(context.Background(), "sessions.floor", []byte(`{"hosts":{"a":1}}`)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAuditPublish measures records published to the fleet's audit
// stream per second from one host's store (batches of 256).
func BenchmarkAuditPublish(b *testing.B) {
	hosts := startHosts(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	a, err := OpenAudit(ctx, hosts[0].f, hosts[0].st, quietLog())
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	cursor := int64(0)
	for b.Loop() {
		b.StopTimer()
		recs := make([]*store.AuditRecord, 256)
		for i := range recs {
			recs[i] = &store.AuditRecord{Tenant: "acme", Kind: "exec", Outcome: "ok"}
		}
		if err := hosts[0].st.AppendAudit(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if cursor, err = a.publish(context.Background(), cursor); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "records/s")
}

package fleetstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/store"
)

// AuditStream is the stream of every host's audit records: subject
// "forkbox.audit.HOST.TENANT", one message per record (auditMessage,
// JSON), its header Forkbox-Seq the record's sequence number in its
// host's own store.
const AuditStream = "forkbox-audit"

const (
	auditSubjects = "forkbox.audit.>"
	seqHeader     = "Forkbox-Seq"
	// auditBatch is how many records one publishing round reads from the
	// store.
	auditBatch = 256
	// auditDedup is the stream's duplicate window: a record published
	// again within it (its host restarted between publishing it and
	// knowing so) is stored once.
	auditDedup = 10 * time.Minute
	// sinceSlack widens a Since filter's start in the stream, whose times
	// are the leader's, to records of hosts whose clocks run behind.
	sinceSlack = time.Minute
)

// auditMessage is one record in AuditStream.
type auditMessage struct {
	Host           string         `json:"host"`
	Seq            int64          `json:"seq"`
	Time           time.Time      `json:"time"`
	Tenant         string         `json:"tenant"`
	Session        string         `json:"session,omitempty"`
	Kind           string         `json:"kind"`
	Outcome        string         `json:"outcome"`
	KeyID          string         `json:"key_id,omitempty"`
	RequestID      string         `json:"request_id,omitempty"`
	IdempotencyKey string         `json:"idempotency_key,omitempty"`
	Detail         map[string]any `json:"detail,omitempty"`
}

// Audit copies this host's audit records (its store's append-only
// trail, which stays as it is) into AuditStream and reads the fleet's
// back. Records are published in order from a cursor, the last local
// sequence number the stream has of this host, read from the stream at
// start: records made while the cluster has no quorum wait in the store
// and go out once it has one again. Safe for concurrent use.
type Audit struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	st     *store.Store
	host   string
	log    *slog.Logger
	wake   chan struct{}
}

// OpenAudit opens (creating when missing) AuditStream on f (replicated
// f.Replicas() times) for st's records, waiting up to ctx for a cluster
// without a quorum yet. Nothing is published until Run.
func OpenAudit(ctx context.Context, f *fleet.Fleet, st *store.Store, log *slog.Logger) (*Audit, error) {
	s, err := f.Stream(ctx, jetstream.StreamConfig{
		Name: AuditStream, Description: "forkbox audit records of every host",
		Subjects: []string{auditSubjects}, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		Duplicates: auditDedup,
	})
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Audit{js: f.JetStream(), stream: s, st: st, host: f.NodeID(), log: log, wake: make(chan struct{}, 1)}, nil
}

// Notify wakes the publisher (store.OnAudit's function): records were
// appended. It never blocks.
func (a *Audit) Notify() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Run publishes this host's records until ctx ends: at once when
// Notify says there are new ones, and every second in any case (a
// failed publish is retried from the cursor then).
func (a *Audit) Run(ctx context.Context) {
	cursor := int64(-1) // unknown until read from the stream
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	failing := false // logged once until a round succeeds
	for {
		var err error
		if cursor < 0 {
			var c int64
			if c, err = a.cursor(ctx); err == nil {
				cursor = c
			}
		}
		if cursor >= 0 {
			cursor, err = a.publish(ctx, cursor)
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			a.log.Warn("fleet: audit records not published yet (kept in the database); retrying every second", "after", cursor, "err", err)
			failing = true
		case err == nil && failing:
			a.log.Info("fleet: audit records published again", "up_to", cursor)
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		case <-tick.C:
		}
	}
}

// cursor returns the local sequence number of this host's last record
// in the stream (0: none).
func (a *Audit) cursor(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := a.stream.GetLastMsgForSubject(ctx, "forkbox.audit."+a.host+".*")
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(m.Header.Get(seqHeader), 10, 64)
}

// publish sends every local record after cursor, in order, and returns
// the new cursor: the last record up to which the stream acknowledged
// every one. A batch goes out without waiting for each acknowledgement
// (the stream replicates each before it answers); a record that failed
// and the ones after it are sent again in the next round, which the
// message ids make harmless.
func (a *Audit) publish(ctx context.Context, cursor int64) (int64, error) {
	for {
		recs, err := a.st.ListAudit(ctx, store.AuditFilter{After: cursor, Limit: auditBatch})
		if err != nil {
			return cursor, err
		}
		futures := make([]jetstream.PubAckFuture, 0, len(recs))
		for _, r := range recs {
			b, err := json.Marshal(auditMessage{Host: a.host, Seq: r.Seq, Time: r.Time, Tenant: r.Tenant, Session: r.Session,
				Kind: r.Kind, Outcome: r.Outcome, KeyID: r.KeyID, RequestID: r.RequestID, IdempotencyKey: r.IdempotencyKey,
				Detail: r.Detail})
			if err != nil {
				return cursor, err
			}
			msg := nats.NewMsg(fmt.Sprintf("forkbox.audit.%s.%s", a.host, subjectToken(r.Tenant)))
			msg.Data = b
			seq := strconv.FormatInt(r.Seq, 10)
			msg.Header.Set(seqHeader, seq)
			f, err := a.js.PublishMsgAsync(msg, jetstream.WithMsgID(a.host+"-"+seq))
			if err != nil {
				break
			}
			futures = append(futures, f)
		}
		wait := time.NewTimer(10 * time.Second)
		for i, f := range futures {
			select {
			case <-f.Ok():
				cursor = recs[i].Seq
				continue
			case err = <-f.Err():
			case <-wait.C:
				err = errors.New("no acknowledgement within 10 s")
			case <-ctx.Done():
				err = ctx.Err()
			}
			break
		}
		wait.Stop()
		if err != nil {
			return cursor, err
		}
		if len(futures) < len(recs) {
			return cursor, errors.New("the publishing client refused a record")
		}
		if len(recs) < auditBatch {
			return cursor, nil
		}
	}
}

// subjectToken is tenant as a subject token: tenant names are already
// (tenancy.ValidateName); anything else becomes "_".
func subjectToken(s string) string {
	if s == "" || strings.ContainsAny(s, ".*> \t\r\n") {
		return "_"
	}
	return s
}

// List returns the fleet's records that f selects, in the stream's order
// (the order they reached it), at most f.Limit (0: 1000). A record's Seq
// is its sequence number in the stream (f.After continues after one) and
// Host the host that made it. ErrUnavailable when the stream cannot be
// read (no quorum).
func (a *Audit) List(ctx context.Context, f store.AuditFilter) ([]*store.AuditRecord, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 1000
	}
	cfg := jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 30 * time.Second,
		MemoryStorage: true, Replicas: 1, FilterSubjects: []string{auditSubjects}}
	if f.Tenant != "" {
		cfg.FilterSubjects = []string{"forkbox.audit.*." + subjectToken(f.Tenant)}
	}
	switch {
	case f.After > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, uint64(f.After)+1
	case !f.Since.IsZero():
		start := f.Since.Add(-sinceSlack)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := a.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: fleet audit: a reader: %v", errdefs.ErrUnavailable, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		a.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	pending := cons.CachedInfo().NumPending
	var out []*store.AuditRecord
	// A consumer just made may have no leader answering yet (its one
	// replica is on another node): "no responders" is asked again, for
	// up to 2 s.
	deadline := time.Now().Add(2 * time.Second)
	for pending > 0 && len(out) < limit {
		batch, err := cons.Fetch(int(min(pending, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("%w: fleet audit: %v", errdefs.ErrUnavailable, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			pending = md.NumPending
			var am auditMessage
			if json.Unmarshal(m.Data(), &am) != nil {
				continue
			}
			r := &store.AuditRecord{Seq: int64(md.Sequence.Stream), Host: am.Host, Time: am.Time, Tenant: am.Tenant,
				Session: am.Session, Kind: am.Kind, Outcome: am.Outcome, KeyID: am.KeyID, RequestID: am.RequestID,
				IdempotencyKey: am.IdempotencyKey, Detail: am.Detail}
			if matches(f, r) && len(out) < limit {
				out = append(out, r)
			}
		}
		if err := batch.Error(); got == 0 && errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline) {
			sleep(ctx, 20*time.Millisecond)
			continue
		} else if err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("%w: fleet audit: read: %v", errdefs.ErrUnavailable, err)
		}
		if got == 0 {
			break
		}
	}
	return out, nil
}

// matches applies the filters of f the stream's subject and start do not
// (the same rules as store.ListAudit).
func matches(f store.AuditFilter, r *store.AuditRecord) bool {
	switch {
	case f.Tenant != "" && r.Tenant != f.Tenant,
		f.Session != "" && r.Session != f.Session,
		f.Outcome != "" && r.Outcome != f.Outcome,
		!f.Since.IsZero() && r.Time.Before(f.Since),
		!f.Until.IsZero() && !r.Time.Before(f.Until):
		return false
	case strings.HasSuffix(f.Kind, "."):
		return strings.HasPrefix(r.Kind, f.Kind)
	case f.Kind != "":
		return r.Kind == f.Kind
	}
	return true
}

package fleet

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyValue opens (creating or updating when needed) the KV bucket named
// bucket on f with history entries per key, on file storage and
// replicated f.Replicas() times, waiting up to ctx for a cluster still
// electing its leaders. It is for the fleet's other packages' buckets
// (package fleetstate); the error names the bucket.
func (f *Fleet) KeyValue(ctx context.Context, bucket, description string, history uint8) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		kv, err = f.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: bucket, Description: description, History: history, Replicas: f.replicas,
			Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// Stream opens (creating or updating when needed) the stream cfg
// describes on f, on file storage and replicated f.Replicas() times (cfg's
// own Storage and Replicas are overridden), waiting up to ctx for a
// cluster still electing its leaders. The error names the stream.
func (f *Fleet) Stream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	cfg.Storage, cfg.Replicas = jetstream.FileStorage, f.replicas
	var s jetstream.Stream
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		s, err = f.js.CreateOrUpdateStream(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

package guest

import (
	"encoding/binary"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// envelope frames msg as one Connect streaming message with flags.
func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// TestStartCommand: the command of a process.Start request is read from
// both encodings; anything it cannot read for sure is not ok.
func TestStartCommand(t *testing.T) {
	req := &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo hi"}}}
	pb, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/bin/sh", "-c", "echo hi"}
	for _, c := range []struct {
		ct   string
		body []byte
		ok   bool
	}{
		{"application/connect+proto", envelope(0, pb), true},
		{"application/connect+json", envelope(0, js), true},
		{"application/connect+proto", envelope(1, pb), false},             // compressed
		{"application/connect+proto", envelope(0, pb)[:len(pb)+4], false}, // cut short
		{"application/connect+proto", append(envelope(0, pb), 0), false},  // more than one message
		{"application/proto", envelope(0, pb), false},
		{"application/connect+json", envelope(0, []byte("{")), false},
		{"application/connect+proto", []byte{0, 0}, false},
	} {
		argv, ok := StartCommand(c.ct, c.body)
		if ok != c.ok || ok && !slices.Equal(argv, want) {
			t.Errorf("%s %x: %q %v, want ok %v", c.ct, c.body, argv, ok, c.ok)
		}
	}
}

package guest

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestDialPort proves DialPort reaches a listener on the agent's loopback
// through the real agent (run on the host here) and passes a half-close
// on, and classifies a port nothing listens on (typed
// port-not-listening, Refused) and a port out of range (field "port").
func TestDialPort(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		s, err := l.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		b, _ := io.ReadAll(s)
		s.Write(append([]byte("echo:"), b...))
	}()
	conn, err := c.DialPort(ctx, l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "echo:ping" {
		t.Fatalf("through the port: %q, %v", got, err)
	}

	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := free.Addr().(*net.TCPAddr).Port
	free.Close()
	_, err = c.DialPort(ctx, closed)
	var te *errdefs.TypedError
	if k, _ := KindOf(err); !errors.As(err, &te) || te.Type != node.ProblemPortNotListening || k != Refused ||
		!errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("closed port: %v", err)
	}
	for _, bad := range []int{0, 70000} {
		if _, err := c.DialPort(ctx, bad); errdefs.Field(err) != "port" {
			t.Errorf("port %d: %v, want a field error on port", bad, err)
		}
	}
}

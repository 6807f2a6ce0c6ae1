package node

import "time"

// EgressRecord is one egress event of a session (see netpolicy.Event).
type EgressRecord struct {
	SessionID          string
	Time               time.Time
	Kind               string
	Host, Addr         string
	Port               int
	BytesUp, BytesDown int64
	Decision, Reason   string
}

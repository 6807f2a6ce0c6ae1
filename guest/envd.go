package guest

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// StartCommand decodes the command of an envd process.Start request as an
// envd client sends it: body is the whole request body (a Connect streaming
// request: one enveloped message, 5 bytes of flags and big-endian length,
// then the message) and contentType its Content-Type,
// "application/connect+proto" or "application/connect+json". It returns
// the program and its arguments; ok is false for a compressed message, an
// envelope whose length is not the rest of body, another content type or
// a message that does not decode.
func StartCommand(contentType string, body []byte) (argv []string, ok bool) {
	if len(body) < 5 || body[0]&1 != 0 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		return nil, false
	}
	var req processpb.StartRequest
	var err error
	switch contentType {
	case "application/connect+proto":
		err = proto.Unmarshal(body[5:], &req)
	case "application/connect+json":
		err = protojson.Unmarshal(body[5:], &req)
	default:
		return nil, false
	}
	if err != nil {
		return nil, false
	}
	p := req.GetProcess()
	return append([]string{p.GetCmd()}, p.GetArgs()...), true
}

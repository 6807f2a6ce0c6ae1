package storage

import (
	"fmt"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxIDLength is the longest layer, snapshot or template id a storage
// driver takes, in bytes.
const MaxIDLength = 128

// idChars are the bytes an id may hold.
const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

// ValidID checks that id can name a layer, snapshot or template of a
// storage driver (what says which, for the message): 1 to MaxIDLength
// bytes of [A-Za-z0-9._-], not starting with '.' (the drivers' temporary
// entries) or '-', and not ending in ".json" (a driver keeps an id's
// metadata in a file named id+".json" beside it). Such an id is one path
// component that needs no quoting anywhere. It is the one rule of both
// drivers; the ids forkbox makes satisfy it (sandbox and snapshot ids are
// 20 characters of [a-z0-9], template names ValidTemplateName). Otherwise
// the error wraps errdefs.ErrInvalidArgument.
func ValidID(what, id string) error {
	ok := id != "" && len(id) <= MaxIDLength && !strings.ContainsAny(id[:1], ".-") &&
		!strings.HasSuffix(id, ".json") && strings.Trim(id, idChars) == ""
	if !ok {
		return fmt.Errorf("%s id %q: must be 1-%d characters of [A-Za-z0-9._-], not starting with '.' or '-' nor ending in \".json\": %w",
			what, id, MaxIDLength, errdefs.ErrInvalidArgument)
	}
	return nil
}

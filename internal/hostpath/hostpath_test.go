package hostpath

import "testing"

// TestRedact proves paths under a root are hidden wherever they are in a
// message (quoted, before a colon, at the end), other paths and names that
// only start like a root are kept, and nil redacts nothing.
func TestRedact(t *testing.T) {
	r := New("/var/lib/forkbox", "/dev/shm/forkbox-ab12/", "", "relative")
	for in, want := range map[string]string{
		`import image "/var/lib/forkbox/templates/.upload-1.tar": bad`: `import image "` + Hidden + `": bad`,
		"dial unix /var/lib/forkbox/sandboxes/x/agent.sock: refused":   "dial unix " + Hidden + ": refused",
		"open /dev/shm/forkbox-ab12/pages.img":                         "open " + Hidden,
		"at /var/lib/forkbox":                                          "at " + Hidden,
		"/var/lib/forkboxes/x and /home/user/x: not found":             "/var/lib/forkboxes/x and /home/user/x: not found",
		"a /var/lib/forkbox/a b /var/lib/forkbox/b":                    "a " + Hidden + " b " + Hidden,
		"nothing here": "nothing here",
	} {
		got, changed := r.Redact(in)
		if got != want || changed != (in != want) {
			t.Errorf("Redact(%q) = %q, %v; want %q", in, got, changed, want)
		}
	}
	var none *Redactor
	if got, changed := none.Redact("/var/lib/forkbox/x"); changed || got != "/var/lib/forkbox/x" {
		t.Errorf("nil redactor changed %q", got)
	}
}

package broker

import (
	"net/http"
	"slices"
	"testing"
)

func TestRewrite(t *testing.T) {
	p1, p2 := NewPlaceholder("openai"), NewPlaceholder("gh")
	bs := []Binding{
		{Name: "openai", Placeholder: p1, Hosts: []string{"api.openai.example"}},
		{Name: "gh", Placeholder: p2, Hosts: []string{"api.gh.example"}, Header: "Authorization: token {value}"},
	}
	vals := map[string]string{"openai": "sk-1", "gh": "ghp-2"}
	lookup := func(n string) ([]byte, bool) { v, ok := vals[n]; return []byte(v), ok }

	h := http.Header{"Authorization": {"Bearer " + p1}, "X-Other": {p2}}
	used, stray, revoked := Rewrite(h, "api.openai.example", bs, lookup)
	if h.Get("Authorization") != "Bearer sk-1" || h.Get("X-Other") != p2 {
		t.Fatalf("headers after rewrite: %v", h)
	}
	if !slices.Equal(used, []string{"openai"}) || !slices.Equal(stray, []string{"gh"}) || revoked != nil {
		t.Fatalf("used %v stray %v revoked %v", used, stray, revoked)
	}

	h = http.Header{}
	Rewrite(h, "api.gh.example", bs, lookup)
	if h.Get("Authorization") != "token ghp-2" {
		t.Fatalf("configured header: %v", h)
	}

	delete(vals, "openai")
	h = http.Header{"Authorization": {"Bearer " + p1}}
	_, _, revoked = Rewrite(h, "api.openai.example", bs, lookup)
	if h.Get("Authorization") != "Bearer "+p1 || !slices.Equal(revoked, []string{"openai"}) {
		t.Fatalf("revoked secret was put in: %v %v", h, revoked)
	}

	// Another session's placeholder is not this session's binding: untouched.
	h = http.Header{"Authorization": {"Bearer " + NewPlaceholder("openai")}}
	vals["openai"] = "sk-1"
	if used, _, _ := Rewrite(h, "api.openai.example", bs, lookup); used != nil {
		t.Fatalf("a foreign placeholder was replaced: %v", h)
	}
}

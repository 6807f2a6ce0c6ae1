package build

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// TestParseErrorsNameTheLine checks that syntax errors and unsupported
// instructions are field errors on "dockerfile" naming their line.
func TestParseErrorsNameTheLine(t *testing.T) {
	cases := map[string]string{
		"FROM base\nRUN true\nSHELL [\"/bin/bash\", \"-c\"]\n": "line 3: SHELL",
		"FROM base\nHEALTHCHECK CMD\n":                         "line 2",
		"FROM base\nHEALTHCHECK WHAT true\n":                   "line 2",
		"FROM base\nHEALTHCHECK NONE true\n":                   "line 2",
		"FROM base\nHEALTHCHECK --start-period=11m CMD true\n": "line 2: HEALTHCHECK --start-period",
		"FROM base\nFROM base\n":                               "line 2: a second FROM",
		"RUN true\n":                                           "line 1: RUN before FROM",
		"FROM base\nCOPY --from=x a b\n":                       "line 2: COPY --from",
		"FROM base\nRUN --mount=type=cache,target=/x ls\n":     "line 2: RUN --mount",
		"FROM base\nADD git@example.com:x/y.git /x\n":          "line 2: ADD of git@",
		"FROM base\nENV\n":                                     "line 2",
		"":                                                     "no instructions",
	}
	for df, want := range cases {
		_, err := Parse([]byte(df))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "dockerfile" || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want a dockerfile field error with %q", df, err, want)
		}
	}
	f, err := Parse([]byte("ARG V=1\nFROM base\n# c\nRUN echo a \\\n  b\nENV A=1\nCMD [\"x\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.From != "base" || f.FromLine != 2 || len(f.MetaArgs) != 1 || len(f.Instrs) != 3 || f.Instrs[0].Line != 4 {
		t.Fatalf("parsed %+v", f)
	}
}

// planOf runs the planner over a Dockerfile's instructions with ctx and
// returns the actions and the keys of the file-changing steps.
func planOf(t *testing.T, df string, c *Context, args map[string]string) (*run, []*action, []string) {
	t.Helper()
	f, err := Parse([]byte(df))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{f: f, spec: Spec{Context: c, BuildArgs: args}, lex: shell.NewLex('\\')}
	r.st.args = map[string]string{}
	key := strings.Repeat("0", 64)
	var acts []*action
	var keys []string
	for _, in := range f.Instrs {
		a, err := r.plan(context.Background(), in)
		if err != nil {
			t.Fatalf("plan %s: %v", in.Text, err)
		}
		if a == nil {
			key = stepKey(key, "meta", in.Text, &r.st, "")
			continue
		}
		key = stepKey(key, a.kind, a.instr, &r.st, a.inputs)
		acts, keys = append(acts, a), append(keys, key)
	}
	return r, acts, keys
}

// contextOf packs files (name → content; a name ending in / is a
// directory, "->" makes a symlink) as a Context.
func contextOf(t *testing.T, files map[string]string) *Context {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		switch {
		case strings.HasSuffix(name, "/"):
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
		case strings.HasPrefix(body, "->"):
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: body[2:]})
		default:
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	p := filepath.Join(t.TempDir(), "ctx.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenContext(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestPlanAndKeys checks expansion, state and the cache keys: the same
// Dockerfile and context give the same keys; a change at step k changes
// the keys from k on and none before; a COPY's key follows its
// sources' content.
func TestPlanAndKeys(t *testing.T) {
	df := "FROM base\nARG WHO=world\nENV GREETING=hello-${WHO}\nWORKDIR app\nCOPY hello.txt ./\nRUN echo $GREETING > out\nUSER user\nRUN id\nCMD [\"cat\", \"out\"]\n"
	c := contextOf(t, map[string]string{"hello.txt": "hi\n", "other": "x"})
	r, acts, keys := planOf(t, df, c, nil)
	if len(acts) != 4 || acts[0].dir != "/app" || acts[1].picks[0].to != "/app/hello.txt" || acts[2].cmd != "echo $GREETING > out" {
		t.Fatalf("actions %+v", acts)
	}
	if v, _ := getenv(r.st.env, "GREETING"); v != "hello-world" || r.st.user != "user" || strings.Join(r.st.cmd, " ") != "cat out" {
		t.Fatalf("state %+v", r.st)
	}
	_, _, again := planOf(t, df, contextOf(t, map[string]string{"hello.txt": "hi\n", "other": "changed"}), nil)
	if strings.Join(again, ",") != strings.Join(keys, ",") {
		t.Fatal("same Dockerfile and COPY sources, different keys")
	}
	_, _, changed := planOf(t, df, contextOf(t, map[string]string{"hello.txt": "bye\n"}), nil)
	if changed[0] != keys[0] || changed[1] == keys[1] || changed[2] == keys[2] {
		t.Fatalf("a changed COPY source: keys %v, were %v", changed, keys)
	}
	_, _, last := planOf(t, strings.Replace(df, "RUN id", "RUN id -u", 1), c, nil)
	if last[0] != keys[0] || last[1] != keys[1] || last[2] != keys[2] || last[3] == keys[3] {
		t.Fatalf("a changed last RUN: keys %v, were %v", last, keys)
	}
	r, _, _ = planOf(t, "FROM base\nARG UNSET\nARG GIVEN\nARG DEF=d\nRUN env\n", nil, map[string]string{"GIVEN": "g", "OTHER": "o"})
	if env := r.st.runEnv(); len(env) != 2 || env["GIVEN"] != "g" || env["DEF"] != "d" {
		t.Fatalf("a RUN's ARGs: %v, want GIVEN and DEF only", env)
	}
	_, _, arg := planOf(t, df, c, map[string]string{"WHO": "you"})
	if arg[2] == keys[2] || arg[3] == keys[3] {
		t.Fatalf("a build arg the steps see: keys %v, were %v", arg, keys)
	}
}

// TestContextConfined checks that a context cannot name paths outside it
// and that COPY sources resolve inside it.
func TestContextConfined(t *testing.T) {
	for _, name := range []string{"../x", "/etc/passwd", "a/../../x"} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644})
		tw.Close()
		p := filepath.Join(t.TempDir(), "c.tar")
		os.WriteFile(p, buf.Bytes(), 0o600)
		f, _ := os.Open(p)
		if _, err := OpenContext(f); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("context entry %q: %v, want invalid argument", name, err)
		}
		f.Close()
	}
	c := contextOf(t, map[string]string{"d/": "", "d/f": "1", "link": "->/etc/passwd"})
	picks, dir, err := c.Select("../../d")
	if err != nil || !dir || len(picks) != 2 || picks[1].Rel != "f" {
		t.Fatalf("Select(../../d) = %+v %v %v", picks, dir, err)
	}
	picks, _, err = c.Select("link")
	if err != nil || len(picks) != 1 || picks[0].E.Type != tar.TypeSymlink {
		t.Fatalf("a symlink source is copied as a link, not followed: %+v %v", picks, err)
	}
	if _, _, err := c.Select("nope"); err == nil {
		t.Fatal("a missing source selected something")
	}
}

// TestFromTemplateName checks that a FROM image is pulled into a
// template name of its tenant's: valid, stable, and another tenant's
// differs (template names are host-wide).
func TestFromTemplateName(t *testing.T) {
	a, b := fromTemplateName("a", "registry.example/app:1"), fromTemplateName("b", "registry.example/app:1")
	if a == b || a != fromTemplateName("a", "registry.example/app:1") || !storage.ValidTemplateName(a) || len(a) != len("from-")+16 {
		t.Fatalf("fromTemplateName: %q, %q", a, b)
	}
}

package e2b

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/build"
	"github.com/forkbox/forkbox/errdefs"
)

// TestDockerfileOf: the SDK's steps become a Dockerfile package build
// parses, with quoting that expands nothing; bad steps name steps[i].
func TestDockerfileOf(t *testing.T) {
	h := strings.Repeat("ab", 32)
	df, err := dockerfileOf(templateSpec{FromImage: "python:3.12", StartCmd: "python -m http.server", Steps: []templateStep{
		{Type: "ENV", Args: []string{"A", `x "y" $HOME \z`, "B", "2"}},
		{Type: "RUN", Args: []string{"apt-get update && apt-get install -y curl", "root"}},
		{Type: "WORKDIR", Args: []string{"/home/user/app dir"}},
		{Type: "COPY", Args: []string{"src", "/home/user/app/", "user", "0755"}, FilesHash: h},
		{Type: "USER", Args: []string{"user"}},
		{Type: "RUN", Args: []string{"echo hi\necho there"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM python:3.12\n" +
		"ENV A=\"x \\\"y\\\" \\$HOME \\\\z\" B=\"2\"\n" +
		"USER root\nRUN [\"/bin/sh\",\"-c\",\"apt-get update \\u0026\\u0026 apt-get install -y curl\"]\nUSER user\n" +
		"WORKDIR \"/home/user/app dir\"\n" +
		"COPY --chown=user [\"src\",\"/home/user/app/\"]\n" +
		"USER root\nRUN [\"/bin/sh\",\"-c\",\"chmod -R 0755 '/home/user/app/src'\"]\nUSER user\n" +
		"USER user\n" +
		"RUN [\"/bin/sh\",\"-c\",\"echo hi\\necho there\"]\n" +
		"CMD [\"/bin/sh\",\"-c\",\"python -m http.server\"]\n"
	if string(df) != want {
		t.Fatalf("dockerfile:\n%s\nwant:\n%s", df, want)
	}
	if _, err := build.Parse(df); err != nil {
		t.Fatalf("build.Parse: %v", err)
	}
	for _, bad := range []templateSpec{
		{Steps: []templateStep{{Type: "EXPOSE", Args: []string{"80"}}}},
		{Steps: []templateStep{{Type: "ENV", Args: []string{"A"}}}},
		{Steps: []templateStep{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: "nothex"}}},
		{Steps: []templateStep{{Type: "WORKDIR", Args: []string{"/a\nRUN evil"}}}},
	} {
		_, err := dockerfileOf(bad)
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != "steps[0]" {
			t.Errorf("%+v: %v, want a field error naming steps[0]", bad.Steps[0], err)
		}
	}
	// readyCmd is the template's ready check: a HEALTHCHECK of its line,
	// whatever it holds (no expansion, no second instruction).
	df, err = dockerfileOf(templateSpec{StartCmd: "python3 -m http.server 8000", ReadyCmd: "ss -tuln | grep :8000\nRUN evil"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(df), "HEALTHCHECK CMD [\"/bin/sh\",\"-c\",\"ss -tuln | grep :8000\\nRUN evil\"]\n") {
		t.Fatalf("dockerfile with readyCmd:\n%s", df)
	}
	if f, err := build.Parse(df); err != nil || len(f.Instrs) != 2 {
		t.Fatalf("build.Parse: %+v, %v", f, err)
	}
	for _, bad := range []string{"  ", strings.Repeat("z", 4097)} {
		var fe *errdefs.FieldError
		if _, err := dockerfileOf(templateSpec{ReadyCmd: bad}); !errors.As(err, &fe) || fe.Field != "readyCmd" {
			t.Errorf("readyCmd %.10q: %v, want a field error naming readyCmd", bad, err)
		}
	}
	if _, err := dockerfileOf(templateSpec{FromImage: "a", FromTemplate: "b"}); err == nil {
		t.Error("fromImage and fromTemplate both set: no error")
	}
}

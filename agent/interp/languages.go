package interp

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Languages a context can have. E2B's reference offers python (the
// default), javascript, typescript, r, java and bash; forkbox offers
// these three (typescript, r and java: 400 naming these).
const (
	Python     = "python"
	JavaScript = "javascript"
	Bash       = "bash"
)

// driverSource is the JavaScript driver (driver.js).
//
//go:embed driver.js
var driverSource string

// languageOf returns the canonical language of name ("" and "python":
// Python; "js" and "javascript"; "bash" and "sh"), or an error naming the
// languages there are.
func languageOf(name string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", Python:
		return Python, nil
	case JavaScript, "js":
		return JavaScript, nil
	case Bash, "sh":
		return Bash, nil
	}
	return "", fmt.Errorf("language %q is not supported; the languages are %s, %s and %s", name, Python, JavaScript, Bash)
}

// startKernel starts an interpreter of language lang in dir.
func startKernel(l Launcher, lang, dir string) (kernel, error) {
	switch lang {
	case Python:
		return startPython(l, dir)
	case JavaScript:
		mark := newMark()
		return startStream(l, lang, []string{"node", "-e", driverSource, string(mark)}, nil, dir, mark, nil, nodeRequest)
	case Bash:
		mark := newMark()
		return startStream(l, lang, []string{"bash", "--noprofile", "--norc"}, nil, dir, mark, bashPrelude(mark), bashRequest)
	}
	return nil, fmt.Errorf("language %q is not supported", lang)
}

// nodeRequest is a cell as driver.js reads it.
func nodeRequest(c cell) ([]byte, error) {
	b, err := json.Marshal(map[string]any{"code": c.code, "env": c.env})
	return append(b, '\n'), err
}

// bashPrelude defines the bash driver's functions: __fb_end prints the
// end marker on stdout and stderr and the end line on descriptor 3;
// __fb_save and __fb_restore keep and put back a variable a call's
// env_vars set. SIGINT runs an empty trap, so it stops the command in
// the foreground (children get the default action) and not bash.
func bashPrelude(mark []byte) []byte {
	return []byte("trap : INT\n" +
		"__fb_mark=" + bashQuote(string(mark)) + "\n" +
		`__fb_end() { printf '%s' "$__fb_mark"; printf '%s' "$__fb_mark" >&2; printf '{"type":"end","rc":%d}\n' "$1" >&3; }` + "\n" +
		`__fb_save() { if [ -n "${!1+x}" ]; then eval "__fb_saved_$1=\${!1}"; else unset "__fb_saved_$1"; fi; }` + "\n" +
		`__fb_restore() { local __fb_s="__fb_saved_$1"; if [ -n "${!__fb_s+x}" ]; then export "$1=${!__fb_s}"; unset "$__fb_s"; else unset "$1"; fi; }` + "\n")
}

// bashRequest is a cell as three bash input lines: the env_vars exported
// (and put back on the third line); the code unquoted by printf %b into a
// variable and run by eval at the top level (so variables, functions and
// the working directory stay between cells) with stdin from /dev/null;
// __fb_end with its status. Lines, because bash drops the rest of an
// input line after some errors (an arithmetic one in an assignment): the
// end line still runs. Code with a NUL byte cannot be a bash string;
// env_vars names must be shell names, not the driver's (__fb_...).
func bashRequest(c cell) ([]byte, error) {
	if strings.ContainsRune(c.code, 0) {
		return nil, errors.New("bash code cannot contain a NUL byte")
	}
	names := make([]string, 0, len(c.env))
	for k := range c.env {
		if !shellName(k) || strings.HasPrefix(k, "__fb_") {
			return nil, fmt.Errorf("env_vars name %q is not a shell variable name (or is the driver's)", k)
		}
		if strings.ContainsRune(c.env[k], 0) {
			return nil, fmt.Errorf("env_vars %s contains a NUL byte", k)
		}
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("__fb_rc=1; ")
	for _, k := range names {
		fmt.Fprintf(&b, "__fb_save %s; export %s=%s; ", k, k, bashQuote(c.env[k]))
	}
	code := strings.NewReplacer(`\`, `\\`, `'`, `\x27`).Replace(c.code)
	b.WriteString("\nprintf -v __fb_code '%b' '" + code + `'; eval "$__fb_code" </dev/null; __fb_rc=$?; unset __fb_code` + "\n")
	for _, k := range names {
		fmt.Fprintf(&b, "__fb_restore %s; ", k)
	}
	b.WriteString("__fb_end \"${__fb_rc:-1}\"\n")
	return []byte(b.String()), nil
}

// bashQuote quotes s as one bash word.
func bashQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellName reports whether s is a shell variable name.
func shellName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

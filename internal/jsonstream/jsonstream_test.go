package jsonstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// decodeString runs String over the JSON string literal lit, reading one
// byte at a time when slow (so every rune and escape is split by a read).
func decodeString(lit []byte, slow bool) ([]byte, error) {
	var r io.Reader = bytes.NewReader(append(append([]byte(`{"k":`), lit...), '}'))
	if slow {
		r = iotest.OneByteReader(r)
	}
	d := NewDecoder(r)
	if err := d.Begin(); err != nil {
		return nil, err
	}
	if k, ok, err := d.Key(); err != nil || !ok || k != "k" {
		return nil, errors.Join(err, errors.New("no key k"))
	}
	var out bytes.Buffer
	if _, err := d.String(&out); err != nil {
		return nil, err
	}
	if _, ok, err := d.Key(); err != nil || ok {
		return nil, errors.Join(err, errors.New("no end of object"))
	}
	return out.Bytes(), d.End()
}

// TestStringMatchesEncodingJSON proves String decodes what encoding/json
// decodes, byte for byte: escapes, surrogate pairs, unpaired surrogates and
// invalid UTF-8 (U+FFFD per bad byte), with reads split anywhere.
func TestStringMatchesEncodingJSON(t *testing.T) {
	for _, lit := range []string{
		`""`, `"plain"`, `"a\"b\\c\/d\be\ff\ng\rh\ti"`, `"\u00e9\u4e2d\ud83d\ude00"`,
		`"\ud83d"`, `"\ude00"`, `"\ud83d\ud83d\ude00"`, `"\ud83dx"`, `"x\ud83d"`, `"\ud83d\u0041"`,
		"\"h\xc3\xa9llo \xe2\x9c\x93\"", "\"bad \xff\xfe utf8 \xc3\"", "\"\xe2\x9c\"", "\"\xf0\x9f\x98\x80\"",
		`"` + strings.Repeat("x", 100<<10) + `\n` + strings.Repeat("é", 50<<10) + `"`,
	} {
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("%.40q: encoding/json: %v", lit, err)
		}
		for _, slow := range []bool{false, true} {
			got, err := decodeString([]byte(lit), slow)
			if err != nil || string(got) != want {
				t.Fatalf("%.40q (slow %v): got %.60q, %v; want %.60q", lit, slow, got, err, want)
			}
		}
	}
}

// TestStringRejectsWhatEncodingJSONRejects proves malformed strings are
// errors, not silently decoded.
func TestStringRejectsWhatEncodingJSONRejects(t *testing.T) {
	for _, lit := range []string{`"abc`, `"a` + "\n" + `b"`, `"\x"`, `"\u12"`, `"\u12g4"`, `7`, `null`, `["a"]`} {
		var v string
		if json.Unmarshal([]byte(lit), &v) == nil && lit != "null" {
			t.Fatalf("%q: encoding/json accepts it; bad test case", lit)
		}
		if got, err := decodeString([]byte(lit), false); err == nil {
			t.Errorf("%q decoded to %q, want an error", lit, got)
		}
	}
}

// FuzzString proves String agrees with encoding/json on any string literal.
func FuzzString(f *testing.F) {
	for _, s := range []string{"a", `\u00e9`, "\xff", `\ud83d\ude00`, `\"`, "\x01"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		lit := append(append([]byte{'"'}, body...), '"')
		var want string
		wantErr := json.Unmarshal(lit, &want)
		got, err := decodeString(lit, false)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: err %v, encoding/json %v", lit, err, wantErr)
		}
		if err == nil && string(got) != want {
			t.Fatalf("%q: got %q, want %q", lit, got, want)
		}
	})
}

// TestRawValues proves Raw returns each kind of value whole (compacted)
// and checks the grammar, so that encoding/json sees what was sent.
func TestRawValues(t *testing.T) {
	body := `{ "a" : [1, -2.5e+3, true, false, null, {"x": ["y", {}]}, []] , "b":"s\"t" ,"c":{ } }`
	d := NewDecoder(iotest.OneByteReader(strings.NewReader(body)))
	if err := d.Begin(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": `[1,-2.5e+3,true,false,null,{"x":["y",{}]},[]]`, "b": `"s\"t"`, "c": `{}`}
	for {
		k, ok, err := d.Key()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		raw, err := d.Raw(1 << 10)
		if err != nil || string(raw) != want[k] {
			t.Fatalf("%s: %s, %v; want %s", k, raw, err, want[k])
		}
		delete(want, k)
	}
	if len(want) != 0 || d.End() != nil {
		t.Fatalf("members left %v, end %v", want, d.End())
	}
}

// TestMalformedObjects proves bad objects are errors: syntax errors with
// an offset, truncation as io.ErrUnexpectedEOF, trailing data at End.
func TestMalformedObjects(t *testing.T) {
	run := func(body string) error {
		d := NewDecoder(strings.NewReader(body))
		if err := d.Begin(); err != nil {
			return err
		}
		for {
			_, ok, err := d.Key()
			if err != nil {
				return err
			}
			if !ok {
				return d.End()
			}
			if _, err := d.Raw(64); err != nil {
				return err
			}
		}
	}
	for body, want := range map[string]string{
		`[]`: "not an array", `"x"`: "not a string", `{"a" 1}`: "expected ':'", `{"a":1 "b":2}`: "expected ','",
		`{a:1}`: "member name", `{"a":01}`: "expected ','", `{"a":-}`: "invalid number", `{"a":1.}`: "decimal point",
		`{"a":1e}`: "exponent", `{"a":tru}`: "literal true", `{"a":[1,]}`: "beginning of a value", `{} x`: "data after",
		`{"a":"` + strings.Repeat("x", 100) + `"}`: ErrTooLarge.Error(), `{,}`: "member name",
	} {
		err := run(body)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want ...%s...", body, err, want)
		}
	}
	for _, body := range []string{`{`, `{"a"`, `{"a":`, `{"a":[1`, `{"a":"x`, `{"a":1,`} {
		if err := run(body); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%q: %v, want unexpected EOF", body, err)
		}
	}
	if err := run("  \n"); !errors.Is(err, io.EOF) {
		t.Errorf("empty body: %v, want io.EOF", err)
	}
}

// TestStringStreamsInPieces proves a large string reaches the writer in
// bounded pieces, never whole.
func TestStringStreamsInPieces(t *testing.T) {
	const size = 4 << 20
	body := io.MultiReader(strings.NewReader(`{"k":"`), io.LimitReader(repeatReader('y'), size), strings.NewReader(`"}`))
	d := NewDecoder(body)
	_ = d.Begin()
	_, _, _ = d.Key()
	largest := 0
	n, err := d.String(writerFunc(func(p []byte) (int, error) {
		largest = max(largest, len(p))
		return len(p), nil
	}))
	if err != nil || n != size || largest > chunkSize+4 {
		t.Fatalf("wrote %d (%v), largest piece %d", n, err, largest)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

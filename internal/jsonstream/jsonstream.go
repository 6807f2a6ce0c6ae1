// Package jsonstream reads one JSON object from a stream field by field,
// so that a large string value can be copied out while it arrives instead
// of being held whole. forkbox's exec API takes a command text and stdin
// data of up to 32 MiB inside a JSON body; encoding/json (and every JSON
// library that hands out tokens) materialises such a value, several times
// over, in the daemon's memory.
//
// The grammar is RFC 8259's. Strings decode as encoding/json decodes them:
// invalid UTF-8 and unpaired surrogate escapes become U+FFFD, one per bad
// byte or escape. Small values are handed out raw (Raw) for encoding/json
// to decode, so their type errors read the same as elsewhere.
package jsonstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"unicode/utf16"
	"unicode/utf8"
)

// bufSize is the read buffer, in bytes; chunkSize the largest piece String
// writes at once.
const (
	bufSize   = 64 << 10
	chunkSize = 32 << 10
	// maxKey bounds an object key, in bytes.
	maxKey = 1 << 10
)

// SyntaxError is malformed JSON at Offset (bytes from the start).
type SyntaxError struct {
	Offset int64
	Msg    string
}

// Error returns the message with its offset.
func (e *SyntaxError) Error() string { return fmt.Sprintf("%s (at byte %d)", e.Msg, e.Offset) }

// ErrTooLarge is returned by Raw for a value longer than its limit.
var ErrTooLarge = errors.New("value too large")

// Decoder reads one top-level JSON object: Begin, then Key and one of
// Raw, String or Skip per member until Key reports the end, then End. It
// is not safe for concurrent use.
type Decoder struct {
	br    *bufio.Reader
	off   int64 // bytes consumed
	first bool  // the next Key is the object's first
	out   []byte
}

// NewDecoder returns a decoder reading r through a 64 KiB buffer. Read
// errors of r (an *http.MaxBytesError, say) are returned wrapped.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{br: bufio.NewReaderSize(r, bufSize)}
}

// Offset returns how many bytes have been consumed.
func (d *Decoder) Offset() int64 { return d.off }

func (d *Decoder) syntax(format string, args ...any) error {
	return &SyntaxError{Offset: d.off, Msg: fmt.Sprintf(format, args...)}
}

// readByte reads one byte; the end of the input is io.ErrUnexpectedEOF.
func (d *Decoder) readByte() (byte, error) {
	c, err := d.br.ReadByte()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	d.off++
	return c, nil
}

// peekNonSpace skips whitespace and returns the next byte without
// consuming it; at the end of the input it returns io.EOF.
func (d *Decoder) peekNonSpace() (byte, error) {
	for {
		b, err := d.br.Peek(1)
		if err != nil {
			return 0, err
		}
		switch b[0] {
		case ' ', '\t', '\n', '\r':
			_, _ = d.br.ReadByte()
			d.off++
		default:
			return b[0], nil
		}
	}
}

// next skips whitespace and reads one byte (io.ErrUnexpectedEOF at the end).
func (d *Decoder) next() (byte, error) {
	if _, err := d.peekNonSpace(); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	return d.readByte()
}

// Begin reads the opening brace of the object. An input of only
// whitespace returns io.EOF; a value of another kind is a *SyntaxError
// whose message names it ("a JSON object is required, not an array").
func (d *Decoder) Begin() error {
	c, err := d.peekNonSpace()
	if err != nil {
		return err
	}
	if c != '{' {
		return d.syntax("a JSON object is required, not %s", kindName(c))
	}
	_, _ = d.readByte()
	d.first = true
	return nil
}

// kindName names the kind of value that starts with c.
func kindName(c byte) string {
	switch {
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == 'n':
		return "null"
	case c == '-' || c >= '0' && c <= '9':
		return "a number"
	}
	return fmt.Sprintf("%q", c)
}

// Key reads the next member's key and its colon. ok is false at the
// object's closing brace.
func (d *Decoder) Key() (key string, ok bool, err error) {
	c, err := d.next()
	if err != nil {
		return "", false, err
	}
	if c == '}' && d.first {
		return "", false, nil
	}
	if !d.first {
		switch c {
		case '}':
			return "", false, nil
		case ',':
			if c, err = d.next(); err != nil {
				return "", false, err
			}
		default:
			return "", false, d.syntax("expected ',' or '}' after a member, found %q", c)
		}
	}
	d.first = false
	if c != '"' {
		return "", false, d.syntax("expected a member name in double quotes, found %q", c)
	}
	var kb limitedBuffer
	kb.limit = maxKey
	if err := d.stringBody(&kb); err != nil {
		if errors.Is(err, ErrTooLarge) {
			return "", false, d.syntax("member name longer than %d bytes", maxKey)
		}
		return "", false, err
	}
	if c, err = d.next(); err != nil {
		return "", false, err
	}
	if c != ':' {
		return "", false, d.syntax("expected ':' after member name, found %q", c)
	}
	return string(kb.b), true, nil
}

// Peek returns the first byte of the next value without consuming it:
// '"', '{', '[', 't', 'f', 'n', '-' or a digit.
func (d *Decoder) Peek() (byte, error) {
	c, err := d.peekNonSpace()
	if errors.Is(err, io.EOF) {
		return 0, io.ErrUnexpectedEOF
	}
	return c, err
}

// String reads the next value, which must be a string (else a
// *SyntaxError naming what it is), and writes its decoded bytes to w in
// pieces of at most 32 KiB. It returns how many bytes it wrote; an error
// of w is returned as is.
func (d *Decoder) String(w io.Writer) (int64, error) {
	c, err := d.next()
	if err != nil {
		return 0, err
	}
	if c != '"' {
		return 0, d.syntax("expected a string, found %s", kindName(c))
	}
	cw := &countingWriter{w: w}
	err = d.stringBody(cw)
	return cw.n, err
}

// Raw reads the next value and returns its bytes as they were sent, at
// most limit of them (else ErrTooLarge, having read past limit).
func (d *Decoder) Raw(limit int) ([]byte, error) {
	lb := &limitedBuffer{limit: limit}
	if err := d.value(lb, 0); err != nil {
		return nil, err
	}
	return lb.b, nil
}

// Skip reads the next value and discards it.
func (d *Decoder) Skip() error { return d.value(io.Discard, 0) }

// End checks that only whitespace follows the object.
func (d *Decoder) End() error {
	c, err := d.peekNonSpace()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	return d.syntax("data after the JSON object (%q)", c)
}

// maxDepth bounds nesting in Raw and Skip, as encoding/json does (10000).
const maxDepth = 10000

// value copies one whole value, raw, to w.
func (d *Decoder) value(w io.Writer, depth int) error {
	if depth > maxDepth {
		return d.syntax("nested too deeply")
	}
	c, err := d.next()
	if err != nil {
		return err
	}
	switch {
	case c == '"':
		if _, err := w.Write([]byte{'"'}); err != nil {
			return err
		}
		return d.rawString(w)
	case c == '{' || c == '[':
		return d.container(w, c, depth)
	case c == 't':
		return d.literal(w, "true")
	case c == 'f':
		return d.literal(w, "false")
	case c == 'n':
		return d.literal(w, "null")
	case c == '-' || c >= '0' && c <= '9':
		return d.number(w, c)
	}
	return d.syntax("invalid character %q looking for the beginning of a value", c)
}

func (d *Decoder) container(w io.Writer, open byte, depth int) error {
	closer := byte(']')
	if open == '{' {
		closer = '}'
	}
	if _, err := w.Write([]byte{open}); err != nil {
		return err
	}
	for i := 0; ; i++ {
		c, err := d.peekNonSpace()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if c == closer {
			_, _ = d.readByte()
			_, err := w.Write([]byte{closer})
			return err
		}
		if i > 0 {
			if c != ',' {
				return d.syntax("expected ',' or %q, found %q", closer, c)
			}
			_, _ = d.readByte()
			if _, err := w.Write([]byte{','}); err != nil {
				return err
			}
		}
		if open == '{' {
			if c, err = d.next(); err != nil {
				return err
			}
			if c != '"' {
				return d.syntax("expected a member name in double quotes, found %q", c)
			}
			if _, err := w.Write([]byte{'"'}); err != nil {
				return err
			}
			if err := d.rawString(w); err != nil {
				return err
			}
			if c, err = d.next(); err != nil {
				return err
			}
			if c != ':' {
				return d.syntax("expected ':' after member name, found %q", c)
			}
			if _, err := w.Write([]byte{':'}); err != nil {
				return err
			}
		}
		if err := d.value(w, depth+1); err != nil {
			return err
		}
	}
}

func (d *Decoder) literal(w io.Writer, lit string) error {
	for i := 1; i < len(lit); i++ {
		c, err := d.readByte()
		if err != nil {
			return err
		}
		if c != lit[i] {
			return d.syntax("invalid character %q in literal %s", c, lit)
		}
	}
	_, err := io.WriteString(w, lit)
	return err
}

// number copies a number that starts with first, checking RFC 8259's
// grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *Decoder) number(w io.Writer, first byte) error {
	buf := []byte{first}
	peek := func() (byte, bool) {
		b, err := d.br.Peek(1)
		if err != nil {
			return 0, false
		}
		return b[0], true
	}
	take := func() byte { c, _ := d.readByte(); buf = append(buf, c); return c }
	digits := func() int {
		n := 0
		for c, ok := peek(); ok && c >= '0' && c <= '9'; c, ok = peek() {
			take()
			n++
			if len(buf) > 1<<10 {
				break
			}
		}
		return n
	}
	c := first
	if c == '-' {
		next, ok := peek()
		if !ok || next < '0' || next > '9' {
			return d.syntax("invalid number")
		}
		c = take()
	}
	if c != '0' {
		digits()
	}
	if c, ok := peek(); ok && c == '.' {
		take()
		if digits() == 0 {
			return d.syntax("invalid number: no digits after the decimal point")
		}
	}
	if c, ok := peek(); ok && (c == 'e' || c == 'E') {
		take()
		if c, ok := peek(); ok && (c == '+' || c == '-') {
			take()
		}
		if digits() == 0 {
			return d.syntax("invalid number: no digits in the exponent")
		}
	}
	if len(buf) > 1<<10 {
		return d.syntax("number longer than 1024 bytes")
	}
	_, err := w.Write(buf)
	return err
}

// rawString copies a string's remaining bytes (after the opening quote)
// and its closing quote unchanged, checking escapes and control bytes.
func (d *Decoder) rawString(w io.Writer) error {
	for {
		// Peek(1) fills the buffer when it is empty; then take all of it.
		if _, err := d.br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		window, _ := d.br.Peek(d.br.Buffered())
		n := 0
		for n < len(window) && window[n] != '"' && window[n] != '\\' && window[n] >= 0x20 {
			n++
		}
		if n > 0 {
			if _, err := w.Write(window[:n]); err != nil {
				return err
			}
			_, _ = d.br.Discard(n)
			d.off += int64(n)
			continue
		}
		c, _ := d.readByte()
		switch {
		case c == '"':
			_, err := w.Write([]byte{'"'})
			return err
		case c < 0x20:
			return d.syntax("control character %q in a string", c)
		}
		// A backslash: check and copy the escape.
		e, err := d.readByte()
		if err != nil {
			return err
		}
		esc := []byte{'\\', e}
		switch e {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			for i := 0; i < 4; i++ {
				h, err := d.readByte()
				if err != nil {
					return err
				}
				if _, ok := hexVal(h); !ok {
					return d.syntax("invalid escape \\u: %q is not a hex digit", h)
				}
				esc = append(esc, h)
			}
		default:
			return d.syntax("invalid escape \\%c in a string", e)
		}
		if _, err := w.Write(esc); err != nil {
			return err
		}
	}
}

func hexVal(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10, true
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10, true
	}
	return 0, false
}

// stringBody decodes a string's remaining bytes (after the opening quote)
// through its closing quote and writes the result to w in pieces.
func (d *Decoder) stringBody(w io.Writer) error {
	d.out = d.out[:0]
	flush := func() error {
		if len(d.out) == 0 {
			return nil
		}
		_, err := w.Write(d.out)
		d.out = d.out[:0]
		return err
	}
	pendingHigh := rune(-1) // a high surrogate escape waiting for its low half
	// lone ends a high surrogate that got no low half: U+FFFD, as in
	// encoding/json.
	lone := func() {
		if pendingHigh >= 0 {
			d.out = utf8.AppendRune(d.out, utf8.RuneError)
			pendingHigh = -1
		}
	}
	emit := func(r rune) {
		lone()
		d.out = utf8.AppendRune(d.out, r)
	}
	for {
		if len(d.out) >= chunkSize {
			if err := flush(); err != nil {
				return err
			}
		}
		if _, err := d.br.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		window, _ := d.br.Peek(min(d.br.Buffered(), chunkSize))
		// Plain ASCII runs go out as they are.
		n := 0
		for n < len(window) && window[n] >= 0x20 && window[n] < utf8.RuneSelf && window[n] != '"' && window[n] != '\\' {
			n++
		}
		if n > 0 {
			lone()
			d.out = append(d.out, window[:n]...)
			_, _ = d.br.Discard(n)
			d.off += int64(n)
			continue
		}
		c := window[0]
		switch {
		case c == '"':
			_, _ = d.readByte()
			lone()
			return flush()
		case c < 0x20:
			return d.syntax("control character %q in a string", c)
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(window)
			if r == utf8.RuneError && size == 1 && !utf8.FullRune(window) {
				// A rune split by the end of the buffer: read it whole.
				var err error
				if r, size, err = d.br.ReadRune(); err != nil {
					return err
				}
				d.off += int64(size)
			} else {
				_, _ = d.br.Discard(size)
				d.off += int64(size)
			}
			emit(r) // invalid bytes are U+FFFD, one per byte, as in encoding/json
			continue
		}
		// A backslash escape.
		_, _ = d.readByte()
		e, err := d.readByte()
		if err != nil {
			return err
		}
		switch e {
		case '"', '\\', '/':
			emit(rune(e))
		case 'b':
			emit('\b')
		case 'f':
			emit('\f')
		case 'n':
			emit('\n')
		case 'r':
			emit('\r')
		case 't':
			emit('\t')
		case 'u':
			var r rune
			for i := 0; i < 4; i++ {
				h, err := d.readByte()
				if err != nil {
					return err
				}
				v, ok := hexVal(h)
				if !ok {
					return d.syntax("invalid escape \\u: %q is not a hex digit", h)
				}
				r = r<<4 | v
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00: // high half
				lone()
				pendingHigh = r
			case utf16.IsSurrogate(r): // low half
				if pendingHigh >= 0 {
					d.out = utf8.AppendRune(d.out, utf16.DecodeRune(pendingHigh, r))
					pendingHigh = -1
				} else {
					d.out = utf8.AppendRune(d.out, utf8.RuneError)
				}
			default:
				emit(r)
			}
		default:
			return d.syntax("invalid escape \\%c in a string", e)
		}
	}
}

// limitedBuffer collects at most limit bytes.
type limitedBuffer struct {
	b     []byte
	limit int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if len(l.b)+len(p) > l.limit {
		return 0, ErrTooLarge
	}
	l.b = append(l.b, p...)
	return len(p), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

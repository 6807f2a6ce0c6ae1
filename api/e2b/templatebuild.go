package e2b

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/build"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/tenancy"
)

// TemplateBuilder builds template name for ctx's caller from a Dockerfile
// and a build context (a tar; nil: empty), reporting progress; it holds
// the tenant's template quota as the REST build does. The api package
// gives the Handler one (SetTemplateBuilder).
type TemplateBuilder func(ctx context.Context, name string, dockerfile []byte, contextTar *os.File, progress func(build.Event)) error

// SetTemplateBuilder serves E2B's template builds (the SDK's
// Template.build: POST /v3/templates, the files' upload links, POST
// /v2/templates/{id}/builds/{bid} and the build status) with b, spooling
// uploads in spoolDir. Without it those routes answer 503.
func (h *Handler) SetTemplateBuilder(b TemplateBuilder, spoolDir string) {
	h.builds.builder, h.builds.dir = b, spoolDir
}

// Bounds of E2B builds held in memory.
const (
	maxBuildsHeld   = 256       // builds kept (oldest finished ones go first)
	maxBuildFiles   = 64        // uploads per build
	maxUploadBytes  = 1 << 30   // one COPY's tar, in bytes
	maxBuildLogs    = 10000     // log entries kept per build
	buildRetention  = time.Hour // how long a finished build's status stays
	templateRequest = 1 << 20   // POST bodies, in bytes
)

// buildRegistry holds the E2B builds of this daemon: their status, logs
// and uploaded files (in memory; a daemon restart forgets them, as it
// forgets a build under way).
type buildRegistry struct {
	builder TemplateBuilder
	dir     string
	mu      sync.Mutex
	builds  map[string]*e2bBuild // build id -> build
}

// e2bBuild is one build requested through POST /v3/templates.
type e2bBuild struct {
	id, tenant, name string
	created          time.Time
	status           string // waiting, building, ready, error
	reason           string
	logs             []logEntry
	files            map[string]string // files hash -> spooled tar
	uploads          map[string]string // upload token -> files hash
	ended            time.Time
}

// logEntry is components.schemas.BuildLogEntry.
type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func uuidLike() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// find returns the caller's build id of template templateID.
func (br *buildRegistry) find(r *http.Request, templateID, id string) (*e2bBuild, error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	b := br.builds[id]
	if b == nil || b.name != templateID || b.tenant != tenancy.TenantOf(r.Context(), "") {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "build %s of template %s", id, templateID)
	}
	return b, nil
}

// log appends an entry to b (under br.mu).
func (br *buildRegistry) log(b *e2bBuild, level, msg string) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if len(b.logs) < maxBuildLogs {
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg})
	}
}

// prune drops finished builds past their retention, and the oldest
// finished ones while more than maxBuildsHeld are held (br.mu held).
func (br *buildRegistry) prune() {
	var oldest *e2bBuild
	for id, b := range br.builds {
		if !b.ended.IsZero() && time.Since(b.ended) > buildRetention {
			br.drop(id)
		} else if !b.ended.IsZero() && (oldest == nil || b.ended.Before(oldest.ended)) {
			oldest = b
		}
	}
	if len(br.builds) >= maxBuildsHeld && oldest != nil {
		br.drop(oldest.id)
	}
}

// drop removes build id and its spooled files (br.mu held).
func (br *buildRegistry) drop(id string) {
	if b := br.builds[id]; b != nil {
		for _, p := range b.files {
			os.Remove(p)
		}
	}
	delete(br.builds, id)
}

// templateBuildRequest is components.schemas.TemplateBuildRequestV3.
type templateBuildRequest struct {
	Name          string   `json:"name"`
	Alias         string   `json:"alias"`
	Tags          []string `json:"tags"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int64    `json:"memoryMB"`
	MinFreeDiskMB int64    `json:"minFreeDiskMb"`
	TeamID        string   `json:"teamID"`
}

// handleRequestBuild: POST /v3/templates {name, tags?, cpuCount?,
// memoryMB?} → 202 {templateID, buildID, aliases, names, tags, public}.
// The template's id is its name (a forkbox template name; a ":tag" suffix
// is dropped: forkbox templates have no tags).
func (h *Handler) handleRequestBuild(w http.ResponseWriter, r *http.Request) {
	if h.builds.builder == nil {
		h.fail(w, r, errdefs.Newf(errdefs.ErrUnavailable, "this server builds no templates"))
		return
	}
	var req templateBuildRequest
	if err := httpjson.Decode(r, &req, templateRequest, httpjson.Options{Peer: true}); err != nil {
		h.fail(w, r, err)
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	name, _, _ = strings.Cut(name, ":")
	if !storage.ValidTemplateName(name) {
		h.fail(w, r, errdefs.InvalidField("name", "%q: a template name is 1-63 characters of [a-z0-9._-], starting with a letter or digit", name))
		return
	}
	b := &e2bBuild{id: uuidLike(), tenant: tenancy.TenantOf(r.Context(), ""), name: name, created: time.Now().UTC(),
		status: "waiting", files: map[string]string{}, uploads: map[string]string{}}
	h.builds.mu.Lock()
	h.builds.prune()
	if len(h.builds.builds) >= maxBuildsHeld {
		h.builds.mu.Unlock()
		h.fail(w, r, errdefs.Newf(errdefs.ErrResourceExhausted, "%d template builds are under way", maxBuildsHeld))
		return
	}
	h.builds.builds[b.id] = b
	h.builds.mu.Unlock()
	httpjson.Write(w, http.StatusAccepted, map[string]any{"templateID": name, "buildID": b.id,
		"aliases": []string{name}, "names": []string{name}, "tags": nonNilStrings(req.Tags), "public": false})
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// validHash is a files hash as the SDK makes it (sha256 hex).
func validHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// handleFileLink: GET /templates/{templateID}/files/{hash} → {present,
// url?}: a link (this server, a one-time token) to PUT the tar of a
// COPY's files to, unless this build has them already. A build knows only
// its own uploads: the link is for the newest build of templateID.
func (h *Handler) handleFileLink(w http.ResponseWriter, r *http.Request) {
	hash := r.PathValue("hash")
	if !validHash(hash) {
		h.fail(w, r, errdefs.InvalidField("hash", "not a sha256 files hash"))
		return
	}
	b := h.builds.newest(r, r.PathValue("templateID"))
	if b == nil {
		h.fail(w, r, errdefs.Newf(errdefs.ErrNotFound, "no build of template %s is waiting for files", r.PathValue("templateID")))
		return
	}
	h.builds.mu.Lock()
	_, present := b.files[hash]
	token := ""
	if !present && len(b.uploads) < maxBuildFiles {
		token = newToken()
		b.uploads[token] = hash
	}
	h.builds.mu.Unlock()
	if present {
		httpjson.Write(w, http.StatusOK, map[string]any{"present": true})
		return
	}
	if token == "" {
		h.fail(w, r, errdefs.Newf(errdefs.ErrResourceExhausted, "a build takes at most %d uploads", maxBuildFiles))
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	url := fmt.Sprintf("%s://%s/templates/%s/files/%s?build=%s&token=%s", scheme, r.Host, b.name, hash, b.id, token)
	httpjson.Write(w, http.StatusCreated, map[string]any{"present": false, "url": url})
}

// newest returns the caller's newest waiting build of template name.
func (br *buildRegistry) newest(r *http.Request, name string) *e2bBuild {
	tenant := tenancy.TenantOf(r.Context(), "")
	br.mu.Lock()
	defer br.mu.Unlock()
	var out *e2bBuild
	for _, b := range br.builds {
		if b.name == name && b.tenant == tenant && b.status == "waiting" && (out == nil || b.created.After(out.created)) {
			out = b
		}
	}
	return out
}

// handleFileUpload: PUT /templates/{templateID}/files/{hash}?build=&token=
// (the link handleFileLink gave; no API key: the one-time token is the
// credential) with the tar (gzip or not) of a COPY's files → 201.
func (h *Handler) handleFileUpload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	hash := r.PathValue("hash")
	h.builds.mu.Lock()
	b := h.builds.builds[q.Get("build")]
	ok := false
	if b != nil && b.name == r.PathValue("templateID") && b.status == "waiting" {
		for tok, hh := range b.uploads {
			if subtle.ConstantTimeCompare([]byte(tok), []byte(q.Get("token"))) == 1 && hh == hash {
				delete(b.uploads, tok)
				ok = true
				break
			}
		}
	}
	h.builds.mu.Unlock()
	if !ok {
		writeError(w, http.StatusForbidden, "this upload link is not valid (or was used)")
		return
	}
	f, err := os.CreateTemp(h.builds.dir, "e2b-files-*.tar")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	_, err = io.Copy(f, http.MaxBytesReader(w, r.Body, maxUploadBytes))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.fail(w, r, httpjson.TooLarge("body", maxUploadBytes))
			return
		}
		h.fail(w, r, errdefs.Newf(errdefs.ErrInvalidArgument, "read the upload: %v", err))
		return
	}
	h.builds.mu.Lock()
	if old, dup := b.files[hash]; dup {
		os.Remove(old)
	}
	b.files[hash] = f.Name()
	h.builds.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

// templateSpec is components.schemas.TemplateBuildStartV2, what the SDK's
// serialize() sends.
type templateSpec struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Force             bool            `json:"force"`
	Steps             []templateStep  `json:"steps"`
}

// templateStep is components.schemas.TemplateStep.
type templateStep struct {
	Type            string   `json:"type"`
	Args            []string `json:"args"`
	Force           bool     `json:"force"`
	FilesHash       string   `json:"filesHash"`
	ForceUpload     bool     `json:"forceUpload"`
	ResolveSymlinks bool     `json:"resolveSymlinks"`
	Gzip            *bool    `json:"gzip"`
}

// handleTriggerBuild: POST /v2/templates/{templateID}/builds/{buildID}
// with the template → 202; the build runs in the background (its status:
// handleBuildStatus).
func (h *Handler) handleTriggerBuild(w http.ResponseWriter, r *http.Request) {
	b, err := h.builds.find(r, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var spec templateSpec
	if err := httpjson.Decode(r, &spec, templateRequest, httpjson.Options{Peer: true}); err != nil {
		h.fail(w, r, err)
		return
	}
	dockerfile, err := dockerfileOf(spec)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if _, err := build.Parse(dockerfile); err != nil {
		h.fail(w, r, err)
		return
	}
	h.builds.mu.Lock()
	if b.status != "waiting" {
		h.builds.mu.Unlock()
		h.fail(w, r, errdefs.Newf(errdefs.ErrConflict, "build %s has started already", b.id))
		return
	}
	for _, st := range spec.Steps {
		if st.Type == "COPY" {
			if _, ok := b.files[st.FilesHash]; !ok {
				h.builds.mu.Unlock()
				h.fail(w, r, errdefs.InvalidField("steps", "the files of COPY %s (hash %s) were not uploaded", strings.Join(st.Args, " "), st.FilesHash))
				return
			}
		}
	}
	b.status = "building"
	files := make([]string, 0, len(b.files))
	for _, st := range spec.Steps {
		if st.Type == "COPY" {
			files = append(files, b.files[st.FilesHash])
		}
	}
	h.builds.mu.Unlock()
	if spec.ReadyCmd != "" {
		h.builds.log(b, "info", fmt.Sprintf("the ready command is the template's ready check, not run at build time: "+
			"every Sandbox.create runs the start command, then waits until %q exits 0 (at most %d s)", spec.ReadyCmd, storage.DefaultReadyTimeoutS))
	}
	ctx := context.WithoutCancel(r.Context()) // the caller's tenant, not its deadline
	go h.runBuild(ctx, b, dockerfile, files)
	w.WriteHeader(http.StatusAccepted)
}

// runBuild runs b and records how it went.
func (h *Handler) runBuild(ctx context.Context, b *e2bBuild, dockerfile []byte, files []string) {
	err := h.buildWith(ctx, b, dockerfile, files)
	h.builds.mu.Lock()
	defer h.builds.mu.Unlock()
	b.ended = time.Now()
	if err != nil {
		msg, _ := h.hide.Redact(err.Error())
		b.status, b.reason = "error", msg
		if len(b.logs) < maxBuildLogs {
			b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC(), Level: "error", Message: b.reason})
		}
		return
	}
	b.status = "ready"
	for _, p := range b.files {
		os.Remove(p)
	}
	b.files = map[string]string{}
}

// buildWith merges the uploads into one context and runs the builder.
func (h *Handler) buildWith(ctx context.Context, b *e2bBuild, dockerfile []byte, files []string) error {
	var contextTar *os.File
	if len(files) > 0 {
		f, err := os.CreateTemp(h.builds.dir, "e2b-context-*.tar")
		if err != nil {
			return err
		}
		defer func() { f.Close(); os.Remove(f.Name()) }()
		if err := mergeTars(f, files); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		contextTar = f
	}
	return h.builds.builder(ctx, b.name, dockerfile, contextTar, func(e build.Event) {
		switch e.Kind {
		case "step":
			h.builds.log(b, "info", fmt.Sprintf("[%d/%d] %s", e.Step, e.Total, e.Instruction))
		case "done":
			msg := fmt.Sprintf("[%d/%d] done in %d ms", e.Step, e.Total, e.DurationMS)
			if e.Cached {
				msg = fmt.Sprintf("[%d/%d] cached", e.Step, e.Total)
			}
			h.builds.log(b, "info", msg)
		case "log":
			for _, line := range strings.Split(strings.TrimRight(e.Data, "\n"), "\n") {
				h.builds.log(b, "info", line)
			}
		case "failed":
			h.builds.log(b, "error", fmt.Sprintf("step %d exited %d", e.Step, e.ExitCode))
		}
	})
}

// mergeTars writes the entries of every tar in files (each gzip or not)
// into one tar on out: the build context (a later entry of a path
// replaces an earlier one, as the SDK's later COPYs would).
func mergeTars(out *os.File, files []string) error {
	tw := tar.NewWriter(out)
	for _, p := range files {
		if err := copyTar(tw, p); err != nil {
			return errdefs.InvalidField("steps", "an uploaded COPY archive is not a tar: %v", err)
		}
	}
	return tw.Close()
}

func copyTar(tw *tar.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(hdr.Name)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// handleBuildStatus: GET /templates/{templateID}/builds/{buildID}/status
// [?logsOffset=N] → {templateID, buildID, status, logEntries, logs,
// reason?}: the log entries from logsOffset on.
func (h *Handler) handleBuildStatus(w http.ResponseWriter, r *http.Request) {
	b, err := h.builds.find(r, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	off := 0
	if s := r.URL.Query().Get("logsOffset"); s != "" {
		if _, err := fmt.Sscan(s, &off); err != nil || off < 0 {
			h.fail(w, r, errdefs.InvalidField("logsOffset", "must be a non-negative integer"))
			return
		}
	}
	h.builds.mu.Lock()
	defer h.builds.mu.Unlock()
	entries := []logEntry{}
	if off < len(b.logs) {
		entries = append(entries, b.logs[off:]...)
	}
	lines := make([]string, len(entries))
	for i, e := range entries {
		lines[i] = e.Message
	}
	out := map[string]any{"templateID": b.name, "buildID": b.id, "status": b.status, "logEntries": entries, "logs": lines}
	if b.status == "error" {
		out["reason"] = map[string]any{"message": b.reason, "logEntries": []logEntry{}}
	}
	httpjson.Write(w, http.StatusOK, out)
}

// dockerfileOf turns the SDK's template into a Dockerfile for package
// build: FROM fromImage (a registry image), fromTemplate (a template) or
// base; each step in order (RUN with a user runs as that user and then
// returns to the current one); startCmd as CMD; readyCmd as HEALTHCHECK
// (the template's ready check). Errors name steps[i], or readyCmd.
func dockerfileOf(spec templateSpec) ([]byte, error) {
	if len(spec.FromImageRegistry) > 0 && string(spec.FromImageRegistry) != "null" {
		return nil, errdefs.InvalidField("fromImageRegistry", "registry credentials through the E2B API are not supported: pull the image with forkbox template import --ref")
	}
	var sb strings.Builder
	from := "base"
	switch {
	case spec.FromImage != "" && spec.FromTemplate != "":
		return nil, errdefs.InvalidField("fromImage", "fromImage and fromTemplate cannot both be set")
	case spec.FromImage != "":
		from = spec.FromImage
	case spec.FromTemplate != "":
		from = spec.FromTemplate
	}
	if strings.ContainsAny(from, " \n\r\t") {
		return nil, errdefs.InvalidField("fromImage", "%q is not an image or template name", from)
	}
	fmt.Fprintf(&sb, "FROM %s\n", from)
	user := ""
	for i, st := range spec.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		for _, a := range st.Args {
			if strings.ContainsAny(a, "\n\r") && st.Type != "RUN" {
				return nil, errdefs.InvalidField(field, "arguments of %s hold no line breaks", st.Type)
			}
		}
		switch st.Type {
		case "RUN":
			if len(st.Args) < 1 || len(st.Args) > 2 {
				return nil, errdefs.InvalidField(field, "RUN takes a command and an optional user")
			}
			cmd, _ := json.Marshal([]string{"/bin/sh", "-c", st.Args[0]})
			if len(st.Args) == 2 && st.Args[1] != "" && st.Args[1] != user {
				fmt.Fprintf(&sb, "USER %s\nRUN %s\n", word(st.Args[1]), cmd)
				fmt.Fprintf(&sb, "USER %s\n", word(userOr(user)))
			} else {
				fmt.Fprintf(&sb, "RUN %s\n", cmd)
			}
		case "ENV":
			if len(st.Args) == 0 || len(st.Args)%2 != 0 {
				return nil, errdefs.InvalidField(field, "ENV takes name and value pairs")
			}
			sb.WriteString("ENV")
			for j := 0; j < len(st.Args); j += 2 {
				fmt.Fprintf(&sb, " %s=%s", word(st.Args[j]), quoted(st.Args[j+1]))
			}
			sb.WriteString("\n")
		case "WORKDIR":
			if len(st.Args) != 1 {
				return nil, errdefs.InvalidField(field, "WORKDIR takes a path")
			}
			fmt.Fprintf(&sb, "WORKDIR %s\n", quoted(st.Args[0]))
		case "USER":
			if len(st.Args) != 1 {
				return nil, errdefs.InvalidField(field, "USER takes a user")
			}
			user = st.Args[0]
			fmt.Fprintf(&sb, "USER %s\n", word(user))
		case "COPY":
			if len(st.Args) < 2 || len(st.Args) > 4 || !validHash(st.FilesHash) {
				return nil, errdefs.InvalidField(field, "COPY takes a source, a destination, an optional user and mode, and its filesHash")
			}
			sb.WriteString("COPY")
			if len(st.Args) > 2 && st.Args[2] != "" {
				fmt.Fprintf(&sb, " --chown=%s", word(st.Args[2]))
			}
			paths, _ := json.Marshal([]string{st.Args[0], st.Args[1]})
			fmt.Fprintf(&sb, " %s\n", paths)
			if len(st.Args) > 3 && st.Args[3] != "" {
				// The builder's COPY has no --chmod: the mode is set by a
				// step of its own, as root, on what was copied.
				mode := st.Args[3]
				if strings.Trim(mode, "01234567") != "" || len(mode) > 4 {
					return nil, errdefs.InvalidField(field, "mode %q is not an octal mode", mode)
				}
				target := st.Args[1]
				if strings.HasSuffix(target, "/") {
					target += path.Base(strings.TrimSuffix(st.Args[0], "/"))
				}
				cmd, _ := json.Marshal([]string{"/bin/sh", "-c", "chmod -R " + mode + " " + shellQuote(target)})
				fmt.Fprintf(&sb, "USER root\nRUN %s\nUSER %s\n", cmd, word(userOr(user)))
			}
		default:
			return nil, errdefs.InvalidField(field, "step type %q is not supported (RUN, ENV, WORKDIR, USER, COPY)", st.Type)
		}
	}
	if spec.StartCmd != "" {
		cmd, _ := json.Marshal([]string{"/bin/sh", "-c", spec.StartCmd})
		fmt.Fprintf(&sb, "CMD %s\n", cmd)
	}
	if spec.ReadyCmd != "" {
		// The SDK's ready check (setReadyCmd, or setStartCmd's second
		// argument: waitForPort, waitForURL, ...) is the template's: a
		// Dockerfile's HEALTHCHECK, which the create waits for.
		argv, err := build.ReadyLine("readyCmd", spec.ReadyCmd)
		if err != nil {
			return nil, err
		}
		cmd, _ := json.Marshal(argv)
		fmt.Fprintf(&sb, "HEALTHCHECK CMD %s\n", cmd)
	}
	return []byte(sb.String()), nil
}

// userOr is the current user of the steps ("user" before any USER).
func userOr(u string) string {
	if u == "" {
		return "user"
	}
	return u
}

// shellQuote is s as one single-quoted shell word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// word is s when it is one Dockerfile word, else s quoted.
func word(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"'\\$=") {
		return s
	}
	return quoted(s)
}

// quoted is s in double quotes with ", \ and $ escaped (Dockerfile
// quoting: no variable is expanded in it).
func quoted(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`)
	return `"` + r.Replace(s) + `"`
}

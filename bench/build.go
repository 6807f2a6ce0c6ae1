package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/client"
)

// GroupBuild is the Dockerfile build rows: a 3-step Dockerfile (buildDockerfile)
// built cold, built again fully cached, and the first session of the
// fresh template until it answered an exec, beside `podman build` of the
// same Dockerfile and context FROM the same image (a static busybox,
// imported into forkbox as a template and loaded into podman from one
// `docker save` tarball) and `podman run --rm` of the image it made.
const GroupBuild = "build"

// The build rows' operations.
const (
	// OpBuildCold is a build whose steps no cache holds (forkbox: the
	// round's context file is new, so every step misses; podman:
	// --no-cache, and the round's images are removed after it).
	OpBuildCold = "build: 3-step Dockerfile, cold"
	// OpBuildCached is the same Dockerfile and context built again into
	// another template (image) right after: every step cached.
	OpBuildCached = "build: same again, fully cached"
	// OpBuildFirst is a create from the template the cached build made
	// until the session answered an exec of `true`; podman: `podman run
	// --rm` of the image to completion of /bin/true. Its target is
	// forkbox's create from the cold build's last step snapshot (the same
	// files), timed the same way in the same rounds.
	OpBuildFirst = "build: first session from the fresh template"
)

// buildBaseRef is the tag the build rows' base image has in the docker
// save tarball (podman loads it under it; forkbox imports it as a
// template).
const buildBaseRef = "localhost/forkbox-bench-build-base:1"

// buildApplets are the busybox commands the base image links (what the
// Dockerfile and forkbox's COPY need).
var buildApplets = []string{"sh", "true", "sleep", "mkdir", "cat", "chmod", "chown", "ln", "echo"}

// buildDockerfile is the Dockerfile both systems build; %s is the FROM.
const buildDockerfile = `FROM %s
COPY stamp.txt /etc/bench-stamp
RUN mkdir -p /usr/local/share && cat /etc/bench-stamp > /usr/local/share/stamp
ENV BENCH_MODE=built
RUN echo "$BENCH_MODE" > /usr/local/share/mode
`

// buildBench is what the build rows share: the base image's tarball and
// the forkbox template made from it.
type buildBench struct {
	dir      string // temporary: the tarball and the rounds' contexts
	tarball  string
	template string // forkbox's base template ("" before it is imported)
	podman   bool   // podman loaded buildBaseRef
}

// writeBuildBase writes the base image (a static busybox with
// buildApplets, PATH=/bin) as a docker save tarball at file.
func writeBuildBase(file string) error {
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("the build rows need a static busybox (apt-get install busybox-static): %w", err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	hdrs := []*tar.Header{{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, {Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))}}
	for _, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
	}
	if _, err := tw.Write(bb); err != nil {
		return err
	}
	for _, a := range buildApplets {
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox"}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}}); err != nil {
		return err
	}
	tag, err := name.NewTag(buildBaseRef)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(file, tag, img)
}

// openBuildBench writes the base image and imports it into forkbox
// (template bench-build-base-RUNID) and, when peers are measured,
// loads it into podman. close removes all of it.
func (e *env) openBuildBench(ctx context.Context) (*buildBench, error) {
	dir, err := os.MkdirTemp("", "forkbox-bench-build-*")
	if err != nil {
		return nil, err
	}
	b := &buildBench{dir: dir, tarball: filepath.Join(dir, "base.tar")}
	if err := writeBuildBase(b.tarball); err != nil {
		return b, err
	}
	tpl := "bench-build-base-" + e.fb.runID
	if _, err := e.fb.c.ImportTemplatePath(ctx, tpl, "", b.tarball); err != nil {
		return b, fmt.Errorf("import the base image: %w", err)
	}
	b.template = tpl
	if e.p != nil && e.p.missing(SystemPodman) == "" {
		b.podman = true
		if _, err := e.p.podman.run(ctx, "load", "--quiet", "--input", b.tarball); err != nil {
			return b, fmt.Errorf("podman load the base image: %w", err)
		}
	}
	return b, nil
}

// close deletes the base template, podman's base image and the
// temporary directory, even after ctx is cancelled.
func (b *buildBench) close(ctx context.Context, e *env) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	if b.template != "" {
		if err := e.fb.c.DeleteTemplate(ctx, b.template); err != nil && !client.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete template %s: %w", b.template, err))
		}
	}
	if b.podman {
		if _, err := e.p.podman.run(ctx, "rmi", "--force", "--ignore", buildBaseRef); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// context writes a new build context for round (of who): the Dockerfile
// FROM from and a stamp.txt no earlier round had, so no step of a build
// of it is cached.
func (b *buildBench) context(who string, round int, from string) (string, error) {
	dir := filepath.Join(b.dir, fmt.Sprintf("ctx-%s-%d", who, round))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	stamp := fmt.Sprintf("%s round %d at %d\n", who, round, time.Now().UnixNano())
	if err := os.WriteFile(filepath.Join(dir, "stamp.txt"), []byte(stamp), 0o644); err != nil {
		return "", err
	}
	df := fmt.Sprintf(buildDockerfile, from)
	return dir, os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644)
}

// measureBuild measures the build rows (GroupBuild). Each forkbox round
// builds two templates from a new context (cold, then cached), creates a
// session of the second until it answered `true`, and then (untimed)
// destroys it, deletes both templates and the steps' snapshots; each
// podman round builds two images of its own new context (--no-cache,
// then cached), runs the second, and removes both (which removes the
// layers its cache would reuse).
func (e *env) measureBuild(ctx context.Context) []Result {
	ops := []string{OpBuildCold, OpBuildCached, OpBuildFirst}
	b, err := e.openBuildBench(ctx)
	if b != nil {
		defer func() {
			if err := b.close(ctx, e); err != nil {
				e.opts.progressf("build: clean-up: %v", err)
			}
		}()
	}
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	f := e.fb
	fbRound, pmRound := 0, 0
	var fromSnap []time.Duration // the counted rounds' create from the last step's snapshot
	fb := contender{system: SystemForkbox, step: func(ctx context.Context) (_ []time.Duration, retErr error) {
		fbRound++
		dir, err := b.context("forkbox", fbRound, b.template)
		if err != nil {
			return nil, err
		}
		df, err := os.ReadFile(filepath.Join(dir, "Dockerfile"))
		if err != nil {
			return nil, err
		}
		var snaps []string // the cold build's step snapshots, in order
		var tpls []string
		prefix := fmt.Sprintf("bench-build-%s-%d-", f.runID, fbRound)
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			var errs []error
			for _, t := range tpls {
				if err := f.c.DeleteTemplate(cctx, t); err != nil && !client.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete template %s: %w", t, err))
				}
			}
			// The steps' snapshots (build-TEMPLATE-N), also those of a
			// build that failed part way.
			all, err := f.c.Snapshots(cctx)
			if err != nil {
				errs = append(errs, fmt.Errorf("list the step snapshots: %w", err))
			}
			for _, sn := range all {
				if !strings.HasPrefix(sn.Name, "build-"+prefix) {
					continue
				}
				if err := f.c.DeleteSnapshot(cctx, sn.ID, true); err != nil && !client.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("delete step snapshot %s: %w", sn.ID, err))
				}
			}
			retErr = errors.Join(append([]error{retErr}, errs...)...)
		}()
		var out []time.Duration
		for i := range 2 {
			tpl := fmt.Sprintf("%s%d", prefix, i)
			var res *client.TemplateBuild
			d, err := timedCall("build "+tpl, func() (err error) {
				res, err = f.c.BuildTemplate(ctx, tpl, client.BuildRequest{Dockerfile: string(df)}, client.BuildOptions{ContextDir: dir})
				return err
			})
			if res != nil && res.Template.Name != "" {
				tpls = append(tpls, tpl)
				for _, s := range res.Steps {
					if s.Snapshot != "" && !slices.Contains(snaps, s.Snapshot) {
						snaps = append(snaps, s.Snapshot)
					}
				}
			}
			if err != nil {
				return nil, err
			}
			// The first build runs every step; the second none.
			if cold := i == 0; cold != (res.Sandboxes > 0) {
				return nil, fmt.Errorf("build %s made %d sandboxes: want it %s", tpl, res.Sandboxes, map[bool]string{true: "cold", false: "fully cached"}[cold])
			}
			out = append(out, d)
		}
		// The same files from a snapshot (the cold build's last step),
		// for the "as from any snapshot" comparison in the row's note; the
		// two creates take turns going first.
		fromTpl := func() (time.Duration, error) { return f.firstSession(ctx, client.CreateRequest{Template: tpls[1]}) }
		fromSnapshot := func() error {
			if len(snaps) == 0 || fbRound <= e.opts.Warmup {
				return nil
			}
			sd, err := f.firstSession(ctx, client.CreateRequest{Snapshot: snaps[len(snaps)-1]})
			if err == nil {
				fromSnap = append(fromSnap, sd)
			}
			return err
		}
		if fbRound%2 == 0 {
			if err := fromSnapshot(); err != nil {
				return nil, err
			}
		}
		d, err := fromTpl()
		if err != nil {
			return nil, err
		}
		if fbRound%2 == 1 {
			if err := fromSnapshot(); err != nil {
				return nil, err
			}
		}
		return append(out, d), nil
	}}
	podman := contender{system: SystemPodman, step: func(ctx context.Context) ([]time.Duration, error) {
		pmRound++
		dir, err := b.context("podman", pmRound, buildBaseRef)
		if err != nil {
			return nil, err
		}
		imgs := []string{e.p.name("build-cold"), e.p.name("build-cached")}
		for i := range imgs {
			imgs[i] = "localhost/" + imgs[i]
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = e.p.podman.run(cctx, slices.Concat([]string{"rmi", "--force", "--ignore"}, imgs)...)
		}()
		var out []time.Duration
		for i, img := range imgs {
			args := slices.Concat([]string{"build", "--quiet", "--pull=never"}, podmanFlags, []string{"--tag", img})
			if i == 0 {
				args = append(args, "--no-cache")
			}
			d, err := e.p.podman.run(ctx, append(args, dir)...)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		name := e.p.name("build-run")
		d, err := e.p.podman.run(ctx, podmanRunArgs("--rm", "--name", name, imgs[1], "/bin/true")...)
		if err != nil {
			e.p.podmanRemove(ctx, name)
			return nil, err
		}
		return append(out, d), nil
	}}
	e.opts.progressf("build: a 3-step Dockerfile cold, cached, and a first session x %d, interleaved with podman build", e.opts.Warmup+e.opts.N)
	rows := e.compete(ctx, e.opts.Warmup, e.opts.N, ops, fb, podman)
	for i := range rows {
		if r := &rows[i]; r.System == SystemForkbox && r.Operation == OpBuildFirst && r.Error == "" && len(fromSnap) > 0 {
			// The target (issue 19): as fast as a session from any
			// snapshot, here the same files' in the same rounds.
			_, p50, p99, _ := summarize(fromSnap)
			r.Target = &Target{P50MS: p50, Met: r.P50MS <= p50}
			r.Note = fmt.Sprintf("target: a create from the last step's snapshot in the same rounds, %.2f / %.2f", p50, p99)
		}
	}
	return rows
}

// firstSession creates a session for req, times it until it answered an
// exec of `true`, and destroys it (untimed).
func (f *forkbox) firstSession(ctx context.Context, req client.CreateRequest) (time.Duration, error) {
	var id string
	d, err := timed(func() error {
		s, _, err := f.createWith(ctx, req)
		if err != nil {
			return err
		}
		id = s.ID
		_, err = f.exec(ctx, id)
		return err
	})
	if id != "" {
		if _, derr := f.destroy(ctx, id); err == nil {
			err = derr
		}
	}
	return d, err
}

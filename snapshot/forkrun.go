package snapshot

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage/changes"
)

// MaxForkRunTimeout bounds ForkRunSpec.Timeout.
const MaxForkRunTimeout = 24 * time.Hour

// scoreWindow is how much of a child's stdout end its score regex sees.
const scoreWindow = 64 << 10

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	b   []byte
}

func (t *tail) write(p []byte) error {
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.max {
		t.b = append(t.b[:0:0], t.b[len(t.b)-t.max:]...)
	}
	return nil
}

func (t *tail) last(n int) string {
	if len(t.b) > n {
		return string(t.b[len(t.b)-n:])
	}
	return string(t.b)
}

// checkRun validates run and returns its compiled score regex (or nil)
// and the score file relative to the root ("" for none).
func checkRun(run *node.ForkRunSpec) (*regexp.Regexp, string, error) {
	if strings.TrimSpace(run.Cmd) == "" {
		return nil, "", errdefs.InvalidField("run.cmd", "is required")
	}
	if run.Timeout < 0 || run.Timeout > MaxForkRunTimeout {
		return nil, "", errdefs.InvalidField("run.timeout_s", "must be between 0 and %d", int(MaxForkRunTimeout/time.Second))
	}
	if run.Timeout == 0 {
		run.Timeout = node.DefaultForkRunTimeout
	}
	switch run.Keep {
	case "":
		run.Keep = node.KeepAll
	case node.KeepAll, node.KeepBest, node.KeepNone:
	default:
		return nil, "", errdefs.InvalidField("keep", "must be all, best or none")
	}
	if run.ScoreRegex != "" && run.ScoreFile != "" {
		return nil, "", errdefs.InvalidField("score", "give stdout_regex or file, not both")
	}
	if run.Keep == node.KeepBest && run.ScoreRegex == "" && run.ScoreFile == "" {
		return nil, "", errdefs.InvalidField("keep", "best needs a score (stdout_regex or file)")
	}
	var re *regexp.Regexp
	if run.ScoreRegex != "" {
		var err error
		if re, err = regexp.Compile(run.ScoreRegex); err != nil {
			return nil, "", errdefs.InvalidField("score.stdout_regex", "%v", err)
		}
	}
	var file string
	if run.ScoreFile != "" {
		var err error
		if file, err = changes.CleanRel("score.file", run.ScoreFile); err != nil {
			return nil, "", err
		}
		if file == "" {
			return nil, "", errdefs.InvalidField("score.file", "must name a file")
		}
	}
	return re, file, nil
}

// ForkRun forks count children from snapshot ref (as Fork, all or
// nothing), runs run.Cmd with /bin/sh -c in every child at once (each
// bounded by run.Timeout), calls emit with each child's result as it
// ends (one call at a time), then destroys the children run.Keep does
// not keep. A child's score is the last number run.ScoreRegex matches in
// the last 64 KiB of its stdout (group 1 when the regex has one), or the
// number in file run.ScoreFile (read from the host, never through a
// symlink, at most 4 KiB); a child whose command failed to run has none.
// "best" keeps the highest score (ties: the lowest index). When ctx ends
// meanwhile the commands are killed and keep still decides. Errors before
// the fork: ErrInvalidArgument naming the field, Fork's errors.
func (s *Service) ForkRun(ctx context.Context, ref string, count int, spec node.CreateSpec, run node.ForkRunSpec, emit func(node.ForkChildResult)) (*node.ForkRunSummary, error) {
	re, scoreFile, err := checkRun(&run)
	if err != nil {
		return nil, err
	}
	sn, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	children, err := s.Fork(ctx, sn.ID, count, spec)
	if err != nil {
		return nil, err
	}
	results := make([]node.ForkChildResult, len(children))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, child := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.runChild(ctx, i, child.ID, run, re, scoreFile)
			mu.Lock()
			defer mu.Unlock()
			results[i] = r
			if emit != nil {
				emit(r)
			}
		}()
	}
	wg.Wait()
	sum := &node.ForkRunSummary{Snapshot: sn.ID, Best: -1}
	for i, r := range results {
		if r.Score != nil && (sum.Best < 0 || *r.Score > *results[sum.Best].Score) {
			sum.Best = i
		}
	}
	var drop []string
	for i, r := range results {
		keep := run.Keep == node.KeepAll || run.Keep == node.KeepBest && i == sum.Best
		if keep {
			sum.Kept = append(sum.Kept, r.SessionID)
		} else {
			drop = append(drop, r.SessionID)
		}
	}
	var dwg sync.WaitGroup
	for _, id := range drop {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			if err := s.core.Destroy(context.WithoutCancel(ctx), id); err != nil {
				s.log.Warn("destroy a fork-and-run child", "session", id, "err", err)
			}
		}()
	}
	dwg.Wait()
	sum.Destroyed = drop
	return sum, nil
}

// runChild runs run.Cmd in child id and scores it.
func (s *Service) runChild(ctx context.Context, i int, id string, run node.ForkRunSpec, re *regexp.Regexp, scoreFile string) node.ForkChildResult {
	r := node.ForkChildResult{Index: i, SessionID: id, ExitCode: -1}
	stdout, stderr := &tail{max: scoreWindow}, &tail{max: node.ForkTailBytes}
	timeoutS := int64((run.Timeout + time.Second - 1) / time.Second)
	began := time.Now()
	res, err := s.core.Exec(ctx, id, node.ExecSpec{Cmd: run.Cmd, TimeoutS: timeoutS}, node.OutputFuncs(nil, stdout.write, stderr.write))
	r.Duration = time.Since(began)
	r.StdoutTail, r.StderrTail = stdout.last(node.ForkTailBytes), stderr.last(node.ForkTailBytes)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.ExitCode, r.TimedOut = res.ExitCode, res.TimedOut
	if res.DurationMS > 0 {
		r.Duration = time.Duration(res.DurationMS) * time.Millisecond
	}
	switch {
	case re != nil:
		ms := re.FindAllStringSubmatch(string(stdout.b), -1)
		if len(ms) > 0 {
			m := ms[len(ms)-1]
			txt := m[0]
			if len(m) > 1 {
				txt = m[1]
			}
			if v, err := strconv.ParseFloat(strings.TrimSpace(txt), 64); err == nil {
				r.Score = &v
			}
		}
	case scoreFile != "":
		t, err := s.openLayerTree(ctx, id)
		if err != nil {
			r.Error = "score file: " + err.Error()
			return r
		}
		defer t.Close()
		b, err := t.ReadFile(scoreFile, 4096)
		if err != nil {
			r.Error = "score file: " + err.Error()
			return r
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil {
			r.Score = &v
		} else {
			r.Error = "score file holds no number"
		}
	}
	return r
}

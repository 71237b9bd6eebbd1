package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// childProcess is the harness's handle on one child running a server (see
// serve.go for the child's side) or, in the many mode, a client (many.go).
type childProcess struct {
	sys   *system
	role  string // "server" or "client", for error messages
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // the child's stdout, line by line; closed at EOF
	addr  string      // where a server listens
	args  string      // for error messages: how to run the child by hand
}

// childWait bounds waiting for a child to start, answer or exit.
const childWait = 10 * time.Second

// startServer re-executes exe (this binary) as a server of sys and waits
// for the address it listens on. The child dies with ctx, and also on its
// own when the harness's end of its stdin closes, so no server outlives the
// harness even when the harness is killed.
//
// With profileDir set, the child writes a CPU profile of its whole life to
// profileDir/server-<system>.pprof.
func startServer(ctx context.Context, exe string, sys *system, profileDir string, so serveOptions) (*childProcess, error) {
	args := []string{serveFlag + sys.name, "-addr=127.0.0.1:0", "-alias-requests=" + strconv.FormatBool(so.aliasRequests)}
	if profileDir != "" {
		args = append(args, "-cpuprofile="+filepath.Join(profileDir, "server-"+sys.name+".pprof"))
	}
	p, err := startChild(ctx, exe, sys, "server", args)
	if err != nil {
		return nil, err
	}
	addr, err := p.readLine(ctx)
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("%s server did not report its address: %w", sys.label, err)
	}
	p.addr = addr
	return p, nil
}

// startChild re-executes exe with args and reads its stdout line by line.
func startChild(ctx context.Context, exe string, sys *system, role string, args []string) (*childProcess, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 2 * time.Second
	p := &childProcess{sys: sys, role: role, cmd: cmd, lines: make(chan string, 4), args: exe + " " + strings.Join(args, " ")}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", sys.label, role, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20) // a client's histogram line is long
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p, nil
}

// readLine waits for the child's next line of stdout, at most childWait.
func (p *childProcess) readLine(ctx context.Context) (string, error) {
	return p.readLineWithin(ctx, childWait)
}

// readLineWithin waits for the child's next line of stdout, at most wait.
func (p *childProcess) readLineWithin(ctx context.Context, wait time.Duration) (string, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case l, ok := <-p.lines:
		if !ok {
			return "", fmt.Errorf("the %s process exited (its error, if any, is above; run %q by hand to see more)", p.role, p.args)
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("no answer from the %s within %s; run %q by hand to see what it does", p.role, wait, p.args)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// stats asks the child for its allocation count and CPU time.
func (p *childProcess) stats(ctx context.Context) (procStats, error) {
	if _, err := io.WriteString(p.stdin, "stats\n"); err != nil {
		return procStats{}, fmt.Errorf("%s server: ask for stats: %w", p.sys.label, err)
	}
	l, err := p.readLine(ctx)
	if err != nil {
		return procStats{}, fmt.Errorf("%s server: read stats: %w", p.sys.label, err)
	}
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "stats" {
		return procStats{}, fmt.Errorf("%s server: stats answer %q is not \"stats <mallocs> <cpu ns> <logs>\"", p.sys.label, l)
	}
	mallocs, err1 := strconv.ParseUint(f[1], 10, 64)
	cpu, err2 := strconv.ParseInt(f[2], 10, 64)
	logs, err3 := strconv.ParseUint(f[3], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return procStats{}, fmt.Errorf("%s server: stats answer %q: %w", p.sys.label, l, err)
	}
	return procStats{mallocs: mallocs, cpu: time.Duration(cpu), logs: logs}, nil
}

// stop asks the child to exit by closing its stdin, and kills it if it has
// not exited within childWait. It is safe to call more than once.
func (p *childProcess) stop() error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil && p.cmd.ProcessState != nil && !p.cmd.ProcessState.Exited() {
			return nil // killed by the context on interrupt: expected
		}
		if err != nil {
			return fmt.Errorf("%s %s exited badly: %w", p.sys.label, p.role, err)
		}
		return nil
	case <-time.After(childWait):
		p.cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s %s did not exit within %s of its stdin closing; killed it", p.sys.label, p.role, childWait)
	}
}

// dump asks the child to write its goroutine stacks to path.
func (p *childProcess) dump(ctx context.Context, path string) error {
	if _, err := io.WriteString(p.stdin, "dump "+path+"\n"); err != nil {
		return err
	}
	l, err := p.readLine(ctx)
	if err != nil {
		return err
	}
	if l != "dumped" {
		return errors.New(l)
	}
	return nil
}

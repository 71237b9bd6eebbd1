package consultest_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// partitionProxy forwards to a stand-in agent until it is partitioned;
// from then on every request, and every response not yet written, hangs
// until the client gives up, as behind a network partition that drops
// packets. With slowRenew, the next session renewal reaches the agent at
// once but its answer takes slowRenew to come back; the partition starts
// right after that answer.
type partitionProxy struct {
	target string

	mu          sync.Mutex
	partitioned bool
	slowRenew   time.Duration
	renewedAt   time.Time // when the last renewal reached the agent
}

func (p *partitionProxy) isPartitioned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.partitioned
}

func (p *partitionProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.isPartitioned() {
		<-r.Context().Done()
		return
	}
	body, _ := io.ReadAll(r.Body)
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+p.target+r.URL.RequestURI(), bytes.NewReader(body))
	req.Header = r.Header.Clone()
	sent := time.Now()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(r.URL.Path, "/v1/session/renew/") {
		p.mu.Lock()
		slow := p.slowRenew
		p.slowRenew = 0
		if slow > 0 || !p.partitioned {
			p.renewedAt = sent
		}
		p.mu.Unlock()
		if slow > 0 {
			time.Sleep(slow)
			p.mu.Lock()
			p.partitioned = true
			p.mu.Unlock()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			w.Write(out)
			return
		}
	}
	if p.isPartitioned() { // the answer is lost in the partition
		<-r.Context().Done()
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// A leader cut off from its agent by a partition (requests hang rather
// than fail) must give up (Lost) before Consul invalidates its session and
// hands the lock to another campaign: two leaders must never coexist. The
// docs promise the leader gives up "when no renewal succeeded for 2/3 of
// session_ttl (before Consul could hand the lock to another)".
func TestElectionLeaderPartitionedGivesUpBeforeAnotherWins(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overrides map[string]any
		slowRenew time.Duration // 0: partition at once
	}{
		// The options every consultest test uses (timeout 2s, session_ttl 1s).
		{"test options, requests hang", nil, 0},
		// The defaults' ratio (session_ttl 20s, timeout 5s) scaled down:
		// the last renewal's answer is slow, then the partition.
		{"default ratio, last answer slow", map[string]any{"timeout": "250ms"}, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := standIn(t, fast)
			p := &partitionProxy{target: s.Addr()}
			hs := httptest.NewServer(p)
			t.Cleanup(hs.Close)
			t.Cleanup(hs.CloseClientConnections)
			a := open(t, strings.TrimPrefix(hs.URL, "http://"), tc.overrides)
			b := open(t, s.Addr(), tc.overrides)
			la, err := a.Campaign(ctx(t), "db-primary", "a")
			if err != nil {
				t.Fatal(err)
			}
			won := campaignAsync(t, b, "b")
			time.Sleep(600 * time.Millisecond) // a renews meanwhile
			select {
			case <-la.Lost():
				t.Fatal("a lost its leadership while connected")
			default:
			}
			p.mu.Lock()
			if tc.slowRenew > 0 {
				p.slowRenew = tc.slowRenew
			} else {
				p.partitioned = true
			}
			p.mu.Unlock()

			select {
			case lb := <-won:
				if lb == nil {
					t.FailNow()
				}
				p.mu.Lock()
				renewed := p.renewedAt
				p.mu.Unlock()
				select {
				case <-la.Lost():
				default:
					start := time.Now()
					since := start.Sub(renewed)
					<-la.Lost()
					t.Errorf("b was elected %s after a's last renewal reached the agent, while a still led; "+
						"a gave up only %s later: two leaders at once",
						since.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("b was not elected")
			}
		})
	}
}

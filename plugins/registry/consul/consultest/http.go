package consultest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	handle := func(pattern, name string, h http.HandlerFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			s.mu.Lock()
			s.requests[name]++
			s.mu.Unlock()
			w.Header().Set("X-Consul-KnownLeader", "true")
			w.Header().Set("X-Consul-LastContact", "0")
			h(w, r)
		})
	}
	handle("PUT /v1/agent/service/register", "PUT /v1/agent/service/register", s.serviceRegister)
	handle("PUT /v1/agent/service/deregister/{id}", "PUT /v1/agent/service/deregister", s.serviceDeregister)
	handle("PUT /v1/agent/check/update/{id}", "PUT /v1/agent/check/update", s.checkUpdate)
	handle("PUT /v1/agent/check/{status}/{id}", "PUT /v1/agent/check/status", s.checkStatus)
	handle("GET /v1/health/service/{service}", "GET /v1/health/service", s.healthService)
	handle("PUT /v1/session/create", "PUT /v1/session/create", s.sessionCreate)
	handle("PUT /v1/session/renew/{id}", "PUT /v1/session/renew", s.sessionRenew)
	handle("PUT /v1/session/destroy/{id}", "PUT /v1/session/destroy", s.sessionDestroy)
	handle("GET /v1/session/info/{id}", "GET /v1/session/info", s.sessionInfo)
	handle("GET /v1/kv/{key...}", "GET /v1/kv", s.kvGet)
	handle("PUT /v1/kv/{key...}", "PUT /v1/kv", s.kvPut)
	handle("DELETE /v1/kv/{key...}", "DELETE /v1/kv", s.kvDelete)
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, code int, format string, args ...any) {
	http.Error(w, fmt.Sprintf(format, args...), code)
}

type checkBody struct {
	CheckID, Name, TTL, Status, DeregisterCriticalServiceAfter string
	HTTP, TCP, GRPC, Interval                                  string
	Args                                                       []string
}

type registrationBody struct {
	ID, Name, Address string
	Port              int
	Tags              []string
	Meta              map[string]string
	Check             *checkBody
	Checks            []*checkBody
}

func (s *Server) serviceRegister(w http.ResponseWriter, r *http.Request) {
	var body registrationBody
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		httpError(w, http.StatusBadRequest, "Request decode failed: %v", err)
		return
	}
	if body.Name == "" {
		httpError(w, http.StatusBadRequest, "Missing service name")
		return
	}
	if err := validateMeta(body.Meta); err != nil {
		httpError(w, http.StatusBadRequest, "Invalid Service Meta: %v", err)
		return
	}
	if body.ID == "" {
		body.ID = body.Name
	}
	checks := body.Checks
	if body.Check != nil {
		checks = append([]*checkBody{body.Check}, checks...)
	}
	if len(checks) > 1 {
		httpError(w, http.StatusBadRequest, "consultest: one check per service is supported")
		return
	}
	svc := &service{ID: body.ID, Name: body.Name, Address: body.Address, Port: body.Port, Tags: body.Tags, Meta: cloneMeta(body.Meta)}
	if len(checks) == 1 {
		c, err := parseCheck(checks[0], body.ID)
		if err != nil {
			httpError(w, http.StatusBadRequest, "%v", err)
			return
		}
		svc.Check = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.register(svc, time.Now())
	s.notifyLocked()
	w.WriteHeader(http.StatusOK)
}

func parseCheck(b *checkBody, serviceID string) (*check, error) {
	if b.TTL == "" || b.HTTP != "" || b.TCP != "" || b.GRPC != "" || len(b.Args) > 0 {
		return nil, fmt.Errorf("consultest: only TTL checks are supported")
	}
	ttl, err := time.ParseDuration(b.TTL)
	if err != nil || ttl <= 0 {
		return nil, fmt.Errorf("Invalid check: TTL must be > 0 for TTL checks (%q)", b.TTL)
	}
	c := &check{ID: b.CheckID, Name: b.Name, TTL: ttl}
	if c.ID == "" {
		c.ID = "service:" + serviceID
	}
	switch b.Status {
	case "", "passing", "warning", "critical":
		c.Status = b.Status
	default:
		return nil, fmt.Errorf("Status for checks must 'passing', 'warning', 'critical'")
	}
	if b.DeregisterCriticalServiceAfter != "" {
		if c.DeregisterAfter, err = time.ParseDuration(b.DeregisterCriticalServiceAfter); err != nil {
			return nil, fmt.Errorf("Invalid DeregisterCriticalServiceAfter %q", b.DeregisterCriticalServiceAfter)
		}
	}
	return c, nil
}

func (s *Server) serviceDeregister(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.st.deregister(id) {
		httpError(w, http.StatusNotFound, "Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id)
		return
	}
	s.notifyLocked()
}

func (s *Server) checkUpdate(w http.ResponseWriter, r *http.Request) {
	var body struct{ Status, Output string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		httpError(w, http.StatusBadRequest, "Request decode failed: %v", err)
		return
	}
	switch body.Status {
	case "passing", "warning", "critical":
	default:
		httpError(w, http.StatusBadRequest, "Invalid check status: '%s'", body.Status)
		return
	}
	s.updateCheck(w, r.PathValue("id"), body.Status, body.Output)
}

func (s *Server) checkStatus(w http.ResponseWriter, r *http.Request) {
	status, ok := map[string]string{"pass": "passing", "warn": "warning", "fail": "critical"}[r.PathValue("status")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	s.updateCheck(w, r.PathValue("id"), status, r.URL.Query().Get("note"))
}

func (s *Server) updateCheck(w http.ResponseWriter, id, status, output string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	svc, c := s.st.checkByID(id)
	if c == nil {
		httpError(w, http.StatusNotFound, "Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id)
		return
	}
	if s.st.updateCheck(svc, c, status, output, time.Now()) {
		s.notifyLocked()
	}
}

type nodeJSON struct {
	ID, Node, Address, Datacenter string
}

type serviceJSON struct {
	ID, Service, Address string
	Tags                 []string
	Meta                 map[string]string
	Port                 int
	CreateIndex          uint64
	ModifyIndex          uint64
}

type checkJSON struct {
	Node, CheckID, Name, Status, Notes, Output, ServiceID, ServiceName, Type string
}

type entryJSON struct {
	Node    nodeJSON
	Service serviceJSON
	Checks  []checkJSON
}

func (s *Server) healthService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("service")
	err := s.block(r, func() uint64 { return s.st.serviceIndex(name) })
	defer s.mu.Unlock()
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	_, passingOnly := r.URL.Query()["passing"]
	entries := []entryJSON{}
	for _, svc := range s.st.byName(name) {
		if passingOnly && !svc.passing() {
			continue
		}
		e := entryJSON{
			Node: nodeJSON{ID: "00000000-0000-0000-0000-000000000001", Node: nodeName, Address: "127.0.0.1", Datacenter: "dc1"},
			Service: serviceJSON{ID: svc.ID, Service: svc.Name, Address: svc.Address, Tags: svc.Tags, Meta: svc.Meta,
				Port: svc.Port, CreateIndex: svc.CreateIndex, ModifyIndex: svc.ModifyIndex},
			Checks: []checkJSON{{Node: nodeName, CheckID: "serfHealth", Name: "Serf Health Status", Status: "passing", Type: "serf"}},
		}
		if c := svc.Check; c != nil {
			e.Checks = append(e.Checks, checkJSON{Node: nodeName, CheckID: c.ID, Name: c.Name, Status: c.Status, Output: c.Output,
				ServiceID: svc.ID, ServiceName: svc.Name, Type: "ttl"})
		}
		entries = append(entries, e)
	}
	w.Header().Set("X-Consul-Index", strconv.FormatUint(s.st.serviceIndex(name), 10))
	writeJSON(w, entries)
}

// readAll reads a small request body.
func readAll(r *http.Request) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r.Body, 512*1024+1))
}

func durationField(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		return time.ParseDuration(str)
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, err
	}
	return time.Duration(n), nil
}

func (s *Server) sessionCreate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name, Node, Behavior, TTL string
		LockDelay                 json.RawMessage
	}
	if b, err := readAll(r); err != nil || (len(b) > 0 && json.Unmarshal(b, &body) != nil) {
		httpError(w, http.StatusBadRequest, "Request decode failed")
		return
	}
	sess := &session{ID: newUUID(), Name: body.Name, Node: nodeName, Behavior: body.Behavior, TTLText: body.TTL, LockDelay: 15 * time.Second}
	if body.Node != "" && body.Node != nodeName {
		httpError(w, http.StatusInternalServerError, "Missing node registration")
		return
	}
	switch sess.Behavior {
	case "":
		sess.Behavior = "release"
	case "release", "delete":
	default:
		httpError(w, http.StatusBadRequest, "Invalid Behavior setting '%s'", sess.Behavior)
		return
	}
	if len(body.LockDelay) > 0 {
		d, err := durationField(body.LockDelay)
		if err != nil || d < 0 || d > time.Minute {
			httpError(w, http.StatusBadRequest, "Request decode failed: invalid LockDelay %s", body.LockDelay)
			return
		}
		sess.LockDelay = d
	}
	if body.TTL != "" {
		ttl, err := time.ParseDuration(body.TTL)
		if err != nil {
			httpError(w, http.StatusBadRequest, "Request decode failed: invalid TTL %q", body.TTL)
			return
		}
		if ttl != 0 && (ttl < s.opts.MinSessionTTL || ttl > 24*time.Hour) {
			httpError(w, http.StatusBadRequest, "Invalid Session TTL '%s', must be between [%v=%v]", ttl, s.opts.MinSessionTTL, 24*time.Hour)
			return
		}
		sess.TTL = ttl
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.renewed = time.Now()
	sess.CreateIndex = s.st.next()
	s.st.sessions[sess.ID] = sess
	writeJSON(w, map[string]string{"ID": sess.ID})
}

func sessionOut(sess *session) map[string]any {
	return map[string]any{
		"ID": sess.ID, "Name": sess.Name, "Node": sess.Node, "LockDelay": int64(sess.LockDelay),
		"Behavior": sess.Behavior, "TTL": sess.TTLText, "NodeChecks": []string{},
		"CreateIndex": sess.CreateIndex, "ModifyIndex": sess.CreateIndex,
	}
}

func (s *Server) sessionRenew(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.st.sessions[id]
	if sess == nil {
		httpError(w, http.StatusNotFound, "Session id '%s' not found", id)
		return
	}
	sess.renewed = time.Now()
	writeJSON(w, []map[string]any{sessionOut(sess)})
}

func (s *Server) sessionDestroy(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.invalidate(r.PathValue("id"), time.Now())
	s.notifyLocked()
	writeJSON(w, true)
}

func (s *Server) sessionInfo(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	if sess := s.st.sessions[r.PathValue("id")]; sess != nil {
		out = append(out, sessionOut(sess))
	}
	w.Header().Set("X-Consul-Index", strconv.FormatUint(s.st.index, 10))
	writeJSON(w, out)
}

func (s *Server) kvGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if r.URL.Query().Has("recurse") {
		s.kvList(w, r, key)
		return
	}
	err := s.block(r, func() uint64 { return s.st.keyIndex(key) })
	defer s.mu.Unlock()
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	w.Header().Set("X-Consul-Index", strconv.FormatUint(s.st.keyIndex(key), 10))
	e := s.st.kv[key]
	if e == nil {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	writeJSON(w, []map[string]any{kvOut(e)})
}

// kvList answers GET /v1/kv/:prefix?recurse: every entry under prefix, by
// key, and 404 when there is none. Its index is the last change under the
// prefix, deletions included (Consul's tombstones).
func (s *Server) kvList(w http.ResponseWriter, r *http.Request, prefix string) {
	err := s.block(r, func() uint64 { return s.st.prefixIndex(prefix) })
	defer s.mu.Unlock()
	if err != nil {
		httpError(w, http.StatusBadRequest, "%v", err)
		return
	}
	w.Header().Set("X-Consul-Index", strconv.FormatUint(s.st.prefixIndex(prefix), 10))
	out := []map[string]any{}
	for _, e := range s.st.under(prefix) {
		out = append(out, kvOut(e))
	}
	if len(out) == 0 {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	writeJSON(w, out)
}

func kvOut(e *kvEntry) map[string]any {
	out := map[string]any{
		"Key": e.Key, "Value": e.Value, "Flags": e.Flags, "LockIndex": e.LockIndex,
		"CreateIndex": e.CreateIndex, "ModifyIndex": e.ModifyIndex,
	}
	if e.Session != "" {
		out["Session"] = e.Session
	}
	return out
}

func (s *Server) kvPut(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q := r.URL.Query()
	value, err := readAll(r)
	if err != nil || len(value) > 512*1024 {
		httpError(w, http.StatusRequestEntityTooLarge, "Value exceeds 524288 byte limit")
		return
	}
	var flags uint64
	if f := q.Get("flags"); f != "" {
		if flags, err = strconv.ParseUint(f, 10, 64); err != nil {
			httpError(w, http.StatusBadRequest, "Invalid flags: %v", err)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ok, err := s.kvWrite(key, value, flags, q, time.Now())
	if err != nil {
		httpError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	if ok {
		s.notifyLocked()
	}
	writeJSON(w, ok)
}

// kvWrite does a PUT on key: plain, check-and-set, acquire or release; s.mu
// is held.
func (s *Server) kvWrite(key string, value []byte, flags uint64, q map[string][]string, now time.Time) (bool, error) {
	st := s.st
	e := st.kv[key]
	get := func(k string) (string, bool) {
		v, ok := q[k]
		if !ok || len(v) == 0 {
			return "", ok
		}
		return v[0], true
	}
	if sid, ok := get("acquire"); ok {
		if st.sessions[sid] == nil {
			return false, fmt.Errorf("invalid session %q", sid)
		}
		switch {
		case e != nil && e.Session == sid:
			st.putKey(key, value, flags)
			return true, nil
		case e != nil && e.Session != "":
			return false, nil
		case e != nil && now.Before(e.lockDelayUntil):
			return false, nil
		}
		e = st.putKey(key, value, flags)
		e.Session = sid
		e.LockIndex++
		return true, nil
	}
	if sid, ok := get("release"); ok {
		if e == nil || e.Session != sid {
			return false, nil
		}
		st.putKey(key, value, flags)
		e.Session = ""
		return true, nil
	}
	if cas, ok := get("cas"); ok {
		want, err := strconv.ParseUint(cas, 10, 64)
		if err != nil {
			return false, fmt.Errorf("invalid cas index %q", cas)
		}
		if (e == nil && want != 0) || (e != nil && e.ModifyIndex != want) {
			return false, nil
		}
	}
	st.putKey(key, value, flags)
	return true, nil
}

// kvDelete answers DELETE /v1/kv/:key. With ?cas=N it deletes only an
// entry whose ModifyIndex is N, and answers whether it did; as in Consul,
// cas=0 deletes nothing.
func (s *Server) kvDelete(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q := r.URL.Query()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.st.kv[key]
	if q.Has("cas") {
		want, err := strconv.ParseUint(q.Get("cas"), 10, 64)
		if err != nil {
			httpError(w, http.StatusBadRequest, "invalid cas index %q", q.Get("cas"))
			return
		}
		if !ok || e.ModifyIndex != want { // never 0: cas=0 deletes nothing
			writeJSON(w, false)
			return
		}
	}
	if ok {
		delete(s.st.kv, key)
		s.st.kvIndex[key] = s.st.next()
		s.notifyLocked()
	}
	writeJSON(w, true)
}

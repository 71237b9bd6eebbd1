package consultest_test

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// Consul looks a service up regardless of the case of its name, and each
// entry keeps the name it was registered with (hashicorp/consul#5707): so
// does the stand-in, and a blocking query on one case hears of a change
// under another.
func TestStandInLooksServicesUpRegardlessOfCase(t *testing.T) {
	s := standIn(t, fast)
	c := apiClient(t, s.Addr())
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "lower", Name: "echo", Port: 1}); err != nil {
		t.Fatal(err)
	}
	entries, meta, err := c.Health().Service("Echo", "", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Service.Service != "echo" {
		t.Fatalf("/v1/health/service/Echo: %d entries; want the one registered as \"echo\", keeping its name", len(entries))
	}
	done := make(chan []*api.ServiceEntry, 1)
	go func() {
		e, _, _ := c.Health().Service("ECHO", "", true, &api.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 5 * time.Second})
		done <- e
	}()
	time.Sleep(100 * time.Millisecond)
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "upper", Name: "Echo", Port: 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if len(e) != 2 {
			t.Errorf("blocking query on ECHO after a registration as Echo: %d entries; want 2", len(e))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a blocking query on ECHO did not hear of a registration as Echo")
	}
}

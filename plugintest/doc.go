// Package plugintest is the conformance suite for kernrpc plugins: one call
// from a plugin's own test certifies it, the way nettest.TestConn certifies a
// net.Conn and fstest.TestFS an fs.FS.
//
//	func TestTransport(t *testing.T) {
//		plugintest.Transport(t, mytransport.Factory, plugintest.TransportConfig{})
//	}
//
// Each entry point (Transport, Codec, Registry, Balancer, Filter) runs named
// subtests, so a failure reads like TestTransport/Frames/1MiB and its message
// says which property broke and how. Every kind also runs the Lifecycle and
// Options subtests: close without use, close twice, use-close-use on a fresh
// instance, and strict decoding of the plugin's options.
//
// A plugin that lacks an optional capability (a registry whose entries never
// expire) declares so through the kernel's capability interfaces; the suite
// then skips the subtests that need it and says why, instead of failing or
// passing silently. docs/plugins.md lists what each suite checks.
package plugintest

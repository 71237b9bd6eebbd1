// Package auth is a filter for bearer tokens: on the server it lets a call
// reach the handler only with a valid token, on the client it attaches
// one. A token is valid if it is one of a static list, or if it is signed
// with one of the server's HMAC keys and has not expired (see Sign).
//
// Config name: "auth". Options, with defaults:
//
//	filters:
//	  - name: auth
//	    side: server
//	    options:
//	      metadata_key: authorization # the request metadata entry: "Bearer <token>"
//	      tokens: []            # static tokens accepted as they are
//	      tokens_env: ""        # an environment variable with more, comma-separated (spaces around each dropped)
//	      keys: {}              # HMAC-SHA256 keys by id, for signed tokens; each at least 32 bytes
//	      keys_env: ""          # an environment variable with more, as id:secret,id:secret
//	      max_token_size: 4KiB  # a longer metadata entry is refused unread
//	  - name: auth
//	    side: client
//	    options:
//	      token: ""             # the token the client attaches
//	      token_env: ""         # or: the environment variable holding it
//
// Environment variables are read when the filter is built (when the
// server or client is made); one that a config names but is unset or
// empty is an error then, and so is a token (static, or the client's)
// too long to fit max_token_size as "Bearer <token>", which could never
// be accepted. A server with neither tokens nor keys accepts
// no call: the filter fails closed.
//
// A missing entry, one that is too large, not "Bearer <token>", an unknown
// token, a bad signature, a signature by an unknown key and an expired
// token all get the same answer, Unauthenticated, saying only that the
// call lacks valid credentials; the server's log says which, at debug
// level, never with the token. Static tokens are kept as their SHA-256
// and compared in constant time with every one of them; signatures are
// compared with hmac.Equal, and a token naming an unknown key is checked
// against a key of no one's, so that the time taken says nothing of it.
//
// On the server the check runs in Admit (kernel.Admitter), before the
// request is decoded, so an unauthenticated caller costs the server no
// decoding; Invoke checks again for callers that do not call Admit (the
// conformance suite), which for a signed token doubles the check's cost.
//
// On the client, a call whose context already carries the metadata entry
// (kernrpc.WithMetadata) keeps its own: the configured token is the
// default, not an override. Put auth before retry and hedge in filters,
// so that it stamps each call once.
//
// # Streams
//
// The filter is a kernel.StreamFilter, with the same options: on the
// client it attaches the token to the request that opens a stream (the
// stream's metadata), and on the server it checks it when the stream
// opens, before the handler runs, so that a stream without a valid token
// never reaches its handler and is answered exactly as a refused unary
// call is, Unauthenticated with the same message. The check runs once per
// stream, not per message: a token that expires while its stream is open
// does not end the stream.
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kernrpc/kernrpc/kernel"
)

// Name is the filter's config name.
const Name = "auth"

// MinKeySize is the shortest HMAC key the filter accepts, in bytes: the
// size of the SHA-256 it signs with.
const MinKeySize = 32

// Options configure the filter.
type Options struct {
	// MetadataKey is the request metadata entry carrying "Bearer <token>".
	MetadataKey string `json:"metadata_key"`
	// Tokens are accepted as they are; TokensEnv names an environment
	// variable with more, comma-separated.
	Tokens    []string `json:"tokens" secret:"true"`
	TokensEnv string   `json:"tokens_env"`
	// Keys are HMAC-SHA256 keys by id, for tokens made with Sign; KeysEnv
	// names an environment variable with more, as "id:secret,id:secret".
	Keys    map[string]string `json:"keys" secret:"true"`
	KeysEnv string            `json:"keys_env"`
	// MaxTokenSize bounds the metadata entry; a longer one is refused
	// without being read.
	MaxTokenSize kernel.Size `json:"max_token_size"`
	// Token is what a client attaches; TokenEnv names an environment
	// variable holding it instead.
	Token    string `json:"token" secret:"true"`
	TokenEnv string `json:"token_env"`

	// Logger receives rejections, at debug level; nil: slog.Default().
	Logger *slog.Logger `json:"-"`
	// Now is the clock signed tokens expire by; nil: time.Now.
	Now func() time.Time `json:"-"`
}

// DefaultOptions returns the options a config without an options block
// gets: a server accepting no call, a client attaching nothing.
func DefaultOptions() *Options {
	return &Options{MetadataKey: "authorization", Tokens: []string{}, Keys: map[string]string{}, MaxTokenSize: 4 << 10}
}

// Factory builds the filter; it is registered from init.
var Factory = kernel.NewFactory(Name, "server: requires a bearer token (static, or HMAC-signed with expiry); client: attaches one", DefaultOptions, New)

func init() { kernel.RegisterFilter(Factory) }

// New builds the filter from decoded options, reading the environment
// variables they name, and names the first bad option.
func New(o *Options) (kernel.Filter, error) {
	if o.MetadataKey == "" {
		return nil, fmt.Errorf(`%s: option "metadata_key": must not be empty`, Name)
	}
	if o.MaxTokenSize < 64 || o.MaxTokenSize > 1<<20 {
		return nil, fmt.Errorf(`%s: option "max_token_size": %d; want 64 bytes to 1MiB`, Name, o.MaxTokenSize)
	}
	f := &Filter{key: o.MetadataKey, maxSize: int(o.MaxTokenSize), now: o.Now, log: o.Logger, keys: map[string]*macKey{}}
	if f.now == nil {
		f.now = time.Now
	}
	if f.log == nil {
		f.log = slog.Default()
	}
	for i, t := range o.Tokens {
		// max_token_size bounds the whole entry, "Bearer <token>": a
		// longer token could never be accepted.
		if err := checkToken(t, f.maxSize-len(bearer)); err != nil {
			return nil, fmt.Errorf(`%s: option "tokens": entry %d %v`, Name, i, err)
		}
		f.static = append(f.static, sha256.Sum256([]byte(t)))
	}
	if o.TokensEnv != "" {
		v, err := env("tokens_env", o.TokensEnv)
		if err != nil {
			return nil, err
		}
		// As keys_env: spaces around an entry are dropped (a token
		// holds none).
		for i, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if err := checkToken(t, f.maxSize-len(bearer)); err != nil {
				return nil, fmt.Errorf(`%s: option "tokens_env": entry %d of $%s %v`, Name, i, o.TokensEnv, err)
			}
			f.static = append(f.static, sha256.Sum256([]byte(t)))
		}
	}
	for id, secret := range o.Keys {
		if err := checkKey(id, secret); err != nil {
			return nil, fmt.Errorf(`%s: option "keys": %v`, Name, err)
		}
		f.keys[id] = newMacKey([]byte(secret))
	}
	if o.KeysEnv != "" {
		v, err := env("keys_env", o.KeysEnv)
		if err != nil {
			return nil, err
		}
		// A key here replaces one of keys with the same id. A bad one is
		// named as the environment's, as a bad tokens_env entry is.
		for i, entry := range strings.Split(v, ",") {
			id, secret, ok := strings.Cut(strings.TrimSpace(entry), ":")
			if !ok {
				return nil, fmt.Errorf(`%s: option "keys_env": entry %d of $%s is not id:secret`, Name, i, o.KeysEnv)
			}
			if err := checkKey(id, secret); err != nil {
				return nil, fmt.Errorf(`%s: option "keys_env": entry %d of $%s: %v`, Name, i, o.KeysEnv, err)
			}
			f.keys[id] = newMacKey([]byte(secret))
		}
	}
	f.nobody = newMacKey(make([]byte, MinKeySize))
	switch {
	case o.Token != "" && o.TokenEnv != "":
		return nil, fmt.Errorf(`%s: option "token_env": set token or token_env, not both`, Name)
	case o.Token != "":
		if err := checkToken(o.Token, f.maxSize-len(bearer)); err != nil {
			return nil, fmt.Errorf(`%s: option "token": %v`, Name, err)
		}
		f.header = bearer + o.Token
	case o.TokenEnv != "":
		v, err := env("token_env", o.TokenEnv)
		if err != nil {
			return nil, err
		}
		if err := checkToken(v, f.maxSize-len(bearer)); err != nil {
			return nil, fmt.Errorf(`%s: option "token_env": $%s %v`, Name, o.TokenEnv, err)
		}
		f.header = bearer + v
	}
	f.scratch.New = func() any { b := make([]byte, 0, 256); return &b }
	return f, nil
}

func env(option, name string) (string, error) {
	v := os.Getenv(name)
	if strings.TrimSpace(v) == "" {
		return "", fmt.Errorf(`%s: option %q: environment variable %s is unset or empty`, Name, option, name)
	}
	return v, nil
}

// checkToken refuses tokens that cannot travel as "Bearer <token>".
func checkToken(t string, max int) error {
	switch {
	case t == "":
		return errors.New("is empty")
	case len(t) > max:
		return fmt.Errorf("is %d bytes, longer than max_token_size allows", len(t))
	case strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return errors.New("holds spaces or control characters")
	}
	return nil
}

// checkKey refuses a key id Sign would refuse, or a secret too short.
func checkKey(id, secret string) error {
	if !validKeyID(id) {
		return fmt.Errorf("key id %q: want letters, digits, _ and - only", id)
	}
	if len(secret) < MinKeySize {
		return fmt.Errorf("key %q is %d bytes; want at least %d", id, len(secret), MinKeySize)
	}
	return nil
}

func validKeyID(id string) bool {
	return id != "" && !strings.ContainsFunc(id, func(r rune) bool {
		return !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	})
}

const bearer = "Bearer "

// strictBase64 reads signatures: one spelling per signature.
var strictBase64 = base64.RawURLEncoding.Strict()

// Filter checks tokens on the server and attaches one on the client.
type Filter struct {
	key     string
	maxSize int
	static  [][sha256.Size]byte
	keys    map[string]*macKey
	nobody  *macKey // checks tokens naming an unknown key
	header  string  // what the client attaches; "" for nothing
	now     func() time.Time
	log     *slog.Logger
	scratch sync.Pool // *[]byte: the token's bytes, for hashing
}

var (
	_ kernel.Filter       = (*Filter)(nil)
	_ kernel.Admitter     = (*Filter)(nil)
	_ kernel.StreamFilter = (*Filter)(nil)
)

// Invoke attaches the token (client) or checks it (server).
func (f *Filter) Invoke(ctx context.Context, info *kernel.CallInfo, req any, next kernel.Invoker) (any, error) {
	if info.Side == kernel.ClientSide {
		f.attach(info)
		return next(ctx, info, req)
	}
	if err := f.verify(ctx, info, "call"); err != nil {
		return nil, err
	}
	return next(ctx, info, req)
}

// InvokeStream attaches the token to the stream's opening (client) or
// checks it before the handler runs (server). The server calls Admit for
// unary calls only, so for a stream this is where the check runs.
func (f *Filter) InvokeStream(ctx context.Context, info *kernel.CallInfo, st kernel.Stream, next kernel.StreamInvoker) error {
	if info.Side == kernel.ClientSide {
		f.attach(info)
		return next(ctx, info, st)
	}
	if err := f.verify(ctx, info, "stream"); err != nil {
		return err
	}
	return next(ctx, info, st)
}

// attach sets the configured token, unless the caller set its own.
func (f *Filter) attach(info *kernel.CallInfo) {
	if f.header != "" && info.Metadata[f.key] == "" {
		info.SetRequestMetadata(f.key, f.header)
	}
}

// Admit checks the token before the server decodes the request
// (kernel.Admitter), so that an unauthenticated call costs no decoding.
// Invoke checks again, for whatever calls it without Admit.
func (f *Filter) Admit(ctx context.Context, info *kernel.CallInfo) error {
	if info.Side == kernel.ClientSide {
		return nil
	}
	return f.verify(ctx, info, "call")
}

// verify answers a call or stream (what) without a valid token with
// Unauthenticated, saying nothing of what was wrong with it; the answer is
// the same for both.
func (f *Filter) verify(ctx context.Context, info *kernel.CallInfo, what string) error {
	why := f.check(info.Metadata[f.key])
	if why == "" {
		return nil
	}
	if f.log.Enabled(ctx, slog.LevelDebug) {
		f.log.LogAttrs(ctx, slog.LevelDebug, Name+": "+what+" rejected", slog.String("method", info.Method),
			slog.String("peer", info.Peer), slog.String("reason", why))
	}
	return kernel.Errorf(kernel.Unauthenticated, "%s: %s needs a valid bearer token in request metadata %q", Name, info.Method, f.key)
}

// check returns "" for a valid entry, else why not, for the log.
func (f *Filter) check(entry string) (why string) {
	switch {
	case entry == "":
		return "no token"
	case len(entry) > f.maxSize:
		return "token too large"
	case len(entry) <= len(bearer) || !strings.EqualFold(entry[:len(bearer)], bearer):
		return `not "Bearer <token>"`
	}
	token := entry[len(bearer):]
	bp := f.scratch.Get().(*[]byte)
	b := append((*bp)[:0], token...)
	defer func() { *bp = b[:0]; f.scratch.Put(bp) }()

	sum := sha256.Sum256(b)
	static := 0
	for i := range f.static {
		static |= subtle.ConstantTimeCompare(sum[:], f.static[i][:])
	}
	if static == 1 {
		return ""
	}
	if len(f.keys) == 0 {
		return "unknown token"
	}
	return f.checkSigned(token, b)
}

// checkSigned checks a token made by Sign; b holds its bytes.
func (f *Filter) checkSigned(token string, b []byte) (why string) {
	version, rest, ok1 := strings.Cut(token, ".")
	id, rest, ok2 := strings.Cut(rest, ".")
	exp, sig, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || version != "v1" || base64.RawURLEncoding.DecodedLen(len(sig)) != sha256.Size {
		return "unknown token"
	}
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return "unknown token"
	}
	k, known := f.keys[id]
	if !known {
		k = f.nobody
	}
	signed := len(token) - len(sig) - 1
	m := k.get()
	defer k.put(m)
	m.h.Reset()
	m.h.Write(b[:signed])
	mac := m.h.Sum(m.sum[:0])
	n, err := strictBase64.Decode(m.sig[:], b[signed+1:])
	good := err == nil && hmac.Equal(mac, m.sig[:n])
	switch {
	case !known:
		return "signed by an unknown key"
	case !good:
		return "bad signature"
	case f.now().Unix() >= expires:
		return "expired"
	}
	return ""
}

// macKey is one HMAC key, with hashes keyed by it for reuse.
type macKey struct{ pool sync.Pool }

type macState struct {
	h   hash.Hash
	sum [sha256.Size]byte
	sig [sha256.Size + 2]byte
}

func newMacKey(secret []byte) *macKey {
	k := &macKey{}
	k.pool.New = func() any { return &macState{h: hmac.New(sha256.New, secret)} }
	return k
}

func (k *macKey) get() *macState  { return k.pool.Get().(*macState) }
func (k *macKey) put(m *macState) { k.pool.Put(m) }

// Sign makes a token that a server holding secret under keyID accepts
// until expires (to the second): "v1.<keyID>.<unix expiry>.<signature>",
// the signature an HMAC-SHA256 of what precedes it, in unpadded base64url.
func Sign(keyID string, secret []byte, expires time.Time) (string, error) {
	if !validKeyID(keyID) {
		return "", fmt.Errorf("%s: key id %q: want letters, digits, _ and - only", Name, keyID)
	}
	if len(secret) < MinKeySize {
		return "", fmt.Errorf("%s: key %q is %d bytes; want at least %d", Name, keyID, len(secret), MinKeySize)
	}
	signed := "v1." + keyID + "." + strconv.FormatInt(expires.Unix(), 10)
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

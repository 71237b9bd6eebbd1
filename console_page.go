package kernrpc

// consolePage is the status console's page: one file, no external
// assets, so that it works on a machine with no way out. Its script reads
// /status.json every second and redraws the tables; values are set as
// text, never as HTML, since peers, metadata and method names come from
// the network. The ids of the figures (total-calls, total-qps, ...) are
// kept stable for tests and scripts that read the rendered page.
const consolePage = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kernrpc status</title>
<style>
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--head:#f5f7fa;--ok:#127a3e;--bad:#b42318;--warn:#b54708;--accent:#2f5bd3}
*{box-sizing:border-box}
body{font:13px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);margin:0;background:#fff}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:.4em 1.6em;padding:.9em 1.4em;border-bottom:1px solid var(--line);background:var(--head)}
header h1{font-size:18px;margin:0}
.kv{color:var(--muted)}.kv b{color:var(--fg);font-weight:600}
main{padding:.4em 1.4em 2em}
section{margin-top:1.2em}
h2{font-size:14px;margin:0 0 .4em;display:flex;gap:.6em;align-items:baseline}
h2 small{font-weight:400;color:var(--muted)}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin-top:1em}
.card{border:1px solid var(--line);border-radius:6px;padding:.5em .9em;min-width:9em}
.card .n{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.card .l{color:var(--muted);font-size:12px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.28em .7em;border-bottom:1px solid var(--line);vertical-align:baseline}
th{background:var(--head);font-weight:600;font-size:12px;color:#344054;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.svc td{background:#fafbfc;font-weight:600;color:var(--accent)}
code,.mono{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.ok{color:var(--ok)}.bad{color:var(--bad)}.warn{color:var(--warn)}.muted{color:var(--muted)}
.empty{color:var(--muted);font-style:italic}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:0 2em}
pre{margin:0;white-space:pre-wrap;word-break:break-all}
#err{color:var(--bad)}
</style></head>
<body>
<header>
<h1>kernrpc <span id="service">…</span></h1>
<span class="kv">status <b id="status">…</b></span>
<span class="kv">instance <b id="instance" class="mono"></b></span>
<span class="kv">uptime <b id="uptime"></b></span>
<span class="kv">updated <b id="updated">never</b></span>
<span id="err"></span>
</header>
<main>
<div class="cards">
<div class="card"><div class="n" id="total-calls">0</div><div class="l">calls since start</div></div>
<div class="card"><div class="n" id="total-qps">0</div><div class="l">calls/s (10s)</div></div>
<div class="card"><div class="n" id="total-errors">0</div><div class="l">errors since start</div></div>
<div class="card"><div class="n" id="in-flight">0</div><div class="l">in flight</div></div>
<div class="card"><div class="n" id="connections">0</div><div class="l">connections</div></div>
</div>
<section><h2>Methods <small>QPS and error rate over the last 10 s; p50/p99 over about the last 10 s</small></h2>
<table id="methods"><thead><tr><th>method</th><th class="num">calls</th><th class="num">QPS</th><th class="num">error rate</th><th class="num">p50</th><th class="num">p99</th><th>codes since start</th></tr></thead><tbody></tbody></table></section>
<div class="grid">
<section><h2>Breakers and limiters <small>readings of the plugins and the engine</small></h2>
<table id="state"><thead><tr><th>reported by</th><th>reading</th><th>labels</th><th class="num">value</th></tr></thead><tbody></tbody></table></section>
<section><h2>Connections</h2>
<table id="conns"><thead><tr><th>peer</th><th>since</th><th class="num">age</th><th class="num">in flight</th></tr></thead><tbody></tbody></table>
<h2 style="margin-top:1.2em">Registry instances <small id="inst-note"></small></h2>
<table id="instances"><thead><tr><th>id</th><th>address</th><th>metadata</th><th class="num">load</th></tr></thead><tbody></tbody></table></section>
</div>
<section><h2>Slowest calls <small>the 20 slowest of the last minute</small></h2>
<table id="slowest"><thead><tr><th>ended</th><th>method</th><th class="num">duration</th><th>code</th><th>peer</th><th>trace id</th></tr></thead><tbody></tbody></table></section>
<section><h2>Plugins <small>effective options: the config's over the plugin's defaults (set ones in bold)</small></h2>
<table id="plugins"><thead><tr><th>kind</th><th>name</th><th>options</th><th>state</th></tr></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
function el(tag, cls, kids) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  for (const k of [].concat(kids === undefined ? [] : kids)) {
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}
function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.append(c instanceof Node && c.tagName === "TD" ? c : el("td", "", c));
  return tr;
}
function num(v) { return el("td", "num", v); }
function fill(id, rows, cols, empty) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...(rows.length ? rows : [row([el("td", "empty", empty)])]));
  if (!rows.length) body.firstChild.firstChild.colSpan = cols;
}
function ms(v) {
  if (!v) return "–";
  if (v >= 1000) return (v / 1000).toFixed(2) + " s";
  if (v >= 1) return v.toFixed(v >= 100 ? 0 : 1) + " ms";
  return (v * 1000).toFixed(0) + " µs";
}
function fmt(v, d) { return Number(v).toLocaleString("en-US", {maximumFractionDigits: d === undefined ? 1 : d}); }
function pct(v) { return v ? (100 * v).toFixed(v < 0.01 ? 2 : 1) + "%" : "0%"; }
function age(s) {
  s = Math.floor(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + (s % 60) + "s";
  return Math.floor(s / 3600) + "h" + Math.floor(s % 3600 / 60) + "m";
}
function time(t) { return new Date(t).toLocaleTimeString("en-GB"); }
function kv(obj) { return Object.keys(obj || {}).sort().map(k => k + "=" + obj[k]).join(" "); }

function render(st) {
  const s = st.summary;
  document.title = "kernrpc " + s.service + " status";
  document.getElementById("service").textContent = s.service;
  const status = document.getElementById("status");
  status.textContent = s.status;
  status.className = s.status === "SERVING" ? "ok" : "bad";
  document.getElementById("instance").textContent = s.instance_id;
  document.getElementById("uptime").textContent = age(s.uptime_s);
  document.getElementById("updated").textContent = time(s.now);
  document.getElementById("total-calls").textContent = fmt(s.calls, 0);
  document.getElementById("total-qps").textContent = fmt(s.qps);
  const errs = document.getElementById("total-errors");
  errs.textContent = fmt(s.errors, 0);
  errs.className = "n" + (s.errors ? " bad" : "");
  document.getElementById("in-flight").textContent = fmt(s.in_flight, 0);
  document.getElementById("connections").textContent = fmt(s.connections, 0);

  const rows = [];
  let svc = null;
  for (const m of st.methods) {
    if (m.service !== svc) {
      svc = m.service;
      const td = el("td", "", svc || "(no service)");
      td.colSpan = 7;
      rows.push(el("tr", "svc", [td]));
    }
    const tr = row([el("td", "mono", m.method.slice(svc ? svc.length + 1 : 0)), num(fmt(m.calls, 0)), num(fmt(m.qps)),
      el("td", "num" + (m.error_rate > 0.05 ? " bad" : m.error_rate > 0 ? " warn" : ""), pct(m.error_rate)),
      num(ms(m.p50_ms)), num(ms(m.p99_ms)), el("td", "mono", kv(m.codes))]);
    tr.dataset.method = m.method;
    rows.push(tr);
  }
  fill("methods", rows, 7, "no methods");

  fill("slowest", st.slowest.map(c => row([time(c.at), el("td", "mono", c.method), num(ms(c.duration_ms)),
    el("td", c.code === "OK" ? "ok" : "bad", c.code), el("td", "mono", c.peer), el("td", "mono", c.trace_id || "–")])), 6, "no calls in the last minute");

  const state = [];
  for (const r of st.state) {
    for (const x of r.readings) {
      // NaN and the infinities come as strings.
      state.push(row([r.kind + " " + r.name, el("td", "mono", x.name), el("td", "mono", kv(x.labels)), num(typeof x.value === "string" ? x.value : fmt(x.value, 3))]));
      state[state.length - 1].title = x.help;
    }
    if (r.error) state.push(row([r.kind + " " + r.name, el("td", "bad", r.error), "", ""]));
  }
  fill("state", state, 4, "no plugin reports its state");

  fill("conns", st.connections.map(c => row([el("td", "mono", c.peer), time(c.since), num(age(c.age_s)), num(c.in_flight)])), 4, "no connection");

  const inst = st.instances;
  document.getElementById("inst-note").textContent = inst.registry + " resolving " + inst.service + " at " + time(inst.resolved) +
    ", cached " + inst.cached_for_s + " s" + (inst.error ? " — error: " + inst.error : "");
  fill("instances", inst.instances.map(i => row([el("td", "mono", [i.id, i.id === inst.self ? el("span", "muted", " (this server)") : ""]),
    el("td", "mono", i.address), el("td", "mono", kv(i.metadata)),
    num(i.load_updated ? i.load_in_flight + " in flight, " + fmt(i.load_qps) + "/s" : "–")])), 4, inst.error ? "error: " + inst.error : "none registered");

  fill("plugins", st.plugins.map(p => {
    const opts = el("td", "mono");
    const set = new Set(p.configured);
    for (const k of Object.keys(p.options || {})) {
      const v = JSON.stringify(p.options[k]);
      opts.append(set.has(k) ? el("b", "", k + "=" + v) : k + "=" + v, " ");
    }
    if (p.options === null) opts.append(el("span", "muted", "no options"));
    if (p.error) opts.append(el("span", "bad", p.error));
    return row([p.kind, el("td", "", [el("b", "", p.name), p.doc ? el("div", "muted", p.doc) : ""]), opts,
      [p.reports_state ? "reports" : "", (p.routes || []).join(" ")].filter(Boolean).join("; ")]);
  }), 4, "none");
}

async function refresh() {
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    render(await r.json());
    document.getElementById("err").textContent = "";
  } catch (e) {
    document.getElementById("err").textContent = "cannot read /status.json: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body></html>
`

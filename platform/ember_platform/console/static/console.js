// The Ember console: polls the control plane's HTTP API with the reader's token and draws plain SVG.
// The token comes from the URL's fragment (/ui#token=..., never sent to a server), is kept in this tab's
// session storage, and is removed from the address bar at once. Everything shown is built with DOM methods
// and textContent: nothing the API returns is ever parsed as HTML.
"use strict";

(() => {
  const KEY = "ember.token";
  const SVG = "http://www.w3.org/2000/svg";
  const POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let apps = [];
  let polls = 0;
  const SCHEDULES_EVERY = 5;

  // --- the token -----------------------------------------------------------------------------------------
  function takeTokenFromFragment() {
    if (!location.hash) return;
    const token = new URLSearchParams(location.hash.slice(1)).get("token");
    if (token) sessionStorage.setItem(KEY, token);
    history.replaceState(null, "", location.pathname);  // the token leaves the address bar and the history
  }

  const token = () => sessionStorage.getItem(KEY);

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    if (timer) clearInterval(timer);
    timer = null;
    $("console").hidden = true;
    $("sign-out").hidden = true;
    $("sign-in").hidden = false;
    $("who").textContent = "";
    $("sign-in-error").textContent = message || "";
  }

  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
    if (options.body) headers["Content-Type"] = "application/json";
    const response = await fetch(path, { ...options, headers, cache: "no-store", credentials: "omit" });
    if (response.status === 401) throw new Unauthorized("the token was refused");
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const message = body && body.error ? body.error.message : response.statusText;
      throw new Error(`${path}: ${response.status} ${message}`);
    }
    return body;
  }

  // --- small DOM and SVG helpers -------------------------------------------------------------------------
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const ms = (s) => (s >= 1 ? `${s.toFixed(2)} s` : `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`);
  const gib = (mb) => `${(mb / 1024).toFixed(1)} GiB`;
  const time = (ts) => new Date(ts * 1000).toLocaleTimeString();

  // --- charts ----------------------------------------------------------------------------------------------
  // A step chart of the last few minutes (at most WINDOW_S seconds, at least MIN_WINDOW_S): each point holds for
  // the interval that ends at its time.
  const WINDOW_S = 180;
  const MIN_WINDOW_S = 30;

  function lineChart(points, series, now, step, { width = 320, height = 90, format = (v) => v.toFixed(1) } = {}) {
    const chart = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const pad = { left: 36, right: 4, top: 6, bottom: 14 };
    const w = width - pad.left - pad.right;
    const h = height - pad.top - pad.bottom;
    chart.append(svg("line", { class: "axis", x1: pad.left, y1: pad.top + h, x2: pad.left + w, y2: pad.top + h }));
    const oldest = points.length ? points[0].t - step : now;
    const window = Math.min(Math.max(now - oldest, MIN_WINDOW_S), WINDOW_S);
    const t0 = now - window;
    points = points.filter((p) => p.t > t0);
    if (points.length === 0) {
      chart.append(svg("text", { x: pad.left + 4, y: pad.top + h / 2 }, "waiting for data"));
      return chart;
    }
    const top = Math.max(...series.flatMap((s) => points.map((p) => p[s.key])), 1e-9);
    chart.append(svg("text", { x: 2, y: pad.top + 8 }, format(top)));
    chart.append(svg("text", { x: 2, y: pad.top + h }, format(0)));
    chart.append(svg("text", { x: pad.left, y: height - 2 }, `-${Math.round(window)} s`));
    chart.append(svg("text", { x: width - 30, y: height - 2 }, "now"));
    const xOf = (t) => (pad.left + (Math.max(t - t0, 0) / window) * w).toFixed(1);
    for (const s of series) {
      const coords = points.flatMap((p, i) => {
        const y = (pad.top + h - (p[s.key] / top) * h).toFixed(1);
        const from = i > 0 ? points[i - 1].t : p.t - step;
        return [`${xOf(from)},${y}`, `${xOf(p.t)},${y}`];
      });
      chart.append(svg("polyline", { class: s.cls, points: coords.join(" "), "data-series": s.key }));
    }
    return chart;
  }

  function memoryBar(device) {
    const width = 420, height = 20;
    const bar = svg("svg", { class: "bar", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const total = Math.max(device.memory_total_mb, 1);
    const used = device.memory_free_mb === null ? null : device.memory_total_mb - device.memory_free_mb;
    bar.append(svg("rect", { class: "total", x: 0, y: 0, width, height }));
    bar.append(svg("rect", { class: "reserved", x: 0, y: 0, height: height / 2,
                             width: (width * Math.min(device.memory_reserved_mb, total)) / total }));
    if (used !== null) {
      bar.append(svg("rect", { class: "used", x: 0, y: height / 2, height: height / 2,
                               width: (width * Math.min(Math.max(used, 0), total)) / total }));
    }
    const label = `${used === null ? "?" : gib(used)} used, ${gib(device.memory_reserved_mb)} reserved of `
      + `${gib(device.memory_total_mb)}`;
    bar.append(svg("text", { x: 4, y: 14 }, label));
    bar.append(svg("title", {}, label));
    return bar;
  }

  const PHASES = ["fetch", "interpreter", "imports", "fork", "setup"];

  function startBar(start, scale) {
    const width = 420, height = 16;
    const bar = svg("svg", { class: "bar", width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    let x = 0;
    for (const phase of PHASES) {
      const seconds = start[`${phase}_s`] || 0;
      const w = (seconds / scale) * (width - 70);
      if (w > 0) {
        const rect = svg("rect", { class: `phase-${phase}`, x, y: 2, width: w, height: height - 4 });
        rect.append(svg("title", {}, `${phase}: ${ms(seconds)}`));
        bar.append(rect);
      }
      x += w;
    }
    bar.append(svg("text", { x: x + 4, y: 12 }, ms(start.ready_s)));
    return bar;
  }

  // --- sections --------------------------------------------------------------------------------------------
  function renderTraffic(stats) {
    const chart = (points, series, options) => lineChart(points, series, stats.now, stats.interval_s, options);
    const box = $("traffic");
    box.replaceChildren();
    if (stats.functions.length === 0) {
      box.append(el("p", { class: "muted" }, "No calls yet."));
      return;
    }
    for (const fn of stats.functions) {
      const last = fn.points.length ? fn.points[fn.points.length - 1] : null;
      const points = fn.points.map(([t, rate, error_rate, p50_s, p99_s]) => ({ t, rate, error_rate, p50_s, p99_s }));
      const card = el("div", { class: "card", "data-function": `${fn.app}.${fn.function}` },
        el("h3", {}, `${fn.app}.${fn.function}`),
        el("div", { class: "figures" },
          el("span", {}, "rate ", el("b", { class: "rate" }, last ? `${last[1].toFixed(1)}/s` : "-")),
          el("span", {}, "p50 ", el("b", {}, last ? ms(last[3]) : "-")),
          el("span", {}, "p99 ", el("b", {}, last ? ms(last[4]) : "-")),
          el("span", {}, "calls ", el("b", {}, fn.calls)),
          el("span", {}, "errors ", el("b", {}, fn.errors))),
        el("div", { class: "muted" }, "calls per second"));
      const rate = chart(points, [{ key: "rate", cls: "line" }]);
      rate.classList.add("rate-chart");
      card.append(rate, el("div", { class: "muted legend" }, el("span", {}, "latency: p50 (solid), p99 (dashed)")),
        chart(points, [{ key: "p50_s", cls: "p50" }, { key: "p99_s", cls: "p99" }], { format: ms }));
      box.append(card);
    }
  }

  function renderApps(status) {
    const body = $("apps").tBodies[0];
    body.replaceChildren();
    const services = new Map(status.services.map((s) => [`${s.app}.${s.service}`, s]));
    for (const app of apps) {
      const versions = (app.versions || []).map((v) => `v${v.version} ${v.state} ${v.percent}%`).join(", ");
      for (const svc of app.services) {
        const s = services.get(`${app.app}.${svc.name}`);
        const replicas = s ? `${s.ready} / ${s.desired} (min ${s.min_replicas}, max ${s.max_replicas})`
          + (s.starting ? `, ${s.starting} starting` : "") + (s.crashed ? `, ${s.crashed} crashed` : "") : "";
        body.append(el("tr", { "data-app": app.app, "data-service": `${app.app}.${svc.name}` },
          el("td", {}, app.app), el("td", {}, `v${app.version}`, versions ? el("div", { class: "muted" }, versions) : ""),
          el("td", {}, svc.name), el("td", {}, svc.functions.join(", ")), el("td", {}, replicas),
          el("td", { class: "note" }, s ? serviceNote(s) : "")));
      }
    }
  }

  // What `ember status` says in its NOTE column: why the service does not run as asked, and its last replacement.
  function serviceNote(s) {
    const notes = [[s.failure, "failed: "], [s.unschedulable, "unschedulable: "], [s.quota, "held back: "],
      [s.replaced, "replaced "]].filter(([text]) => text).map(([text, label]) => label + text);
    return notes.join("; ") || "-";
  }

  const when = (ts) => {
    const at = new Date(ts * 1000);
    return `${at.toLocaleString()} (${at.toISOString().slice(11, 19)} UTC)`;
  };

  function renderSchedules(views) {
    const body = $("schedules").tBodies[0];
    body.replaceChildren();
    for (const v of views) {
      const status = v.last_call_status ? ` (call ${v.last_call_status})` : "";
      const last = v.last_tick ? el("span", {}, `${when(v.last_tick)} `, el("b", { class: `last-${v.last_status}` },
        v.last_status || "-"), status) : "-";
      body.append(el("tr", { "data-schedule": `${v.app}.${v.function}`, class: v.paused ? "paused" : "" },
        el("td", {}, `${v.app}.${v.function}`), el("td", { class: "words" }, v.schedule),
        el("td", { class: "next" }, v.paused ? "paused" : when(v.next_run)), el("td", { class: "last" }, last),
        el("td", {}, v.runs), el("td", { class: "is-paused" }, v.paused ? "yes" : "no")));
    }
    if (!views.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No scheduled functions.")));
  }

  function replicaChip(r) {
    return el("span", { class: `replica state-${r.state}`, "data-replica": r.replica_id,
                        title: `${r.app}.${r.service} v${r.version}: ${r.state}` },
      `${r.app}.${r.service} v${r.version} ${r.replica_id.slice(0, 12)} ${r.state}`);
  }

  function zygoteChip(z) {
    return el("span", { class: `replica zygote state-${z.state}`, "data-zygote": `${z.app}.${z.service}`,
                        title: `a zygote of ${z.app}.${z.service} v${z.version}: its replicas fork from it` },
      `zygote ${z.app}.${z.service} v${z.version} ${z.state}`);
  }

  function renderNodes(status) {
    const box = $("nodes");
    box.replaceChildren();
    for (const node of status.nodes) {
      const byId = new Map(node.replicas.map((r) => [r.replica_id, r]));
      const card = el("div", { class: "node", "data-node": node.node_id }, el("h3", {}, `${node.node_id} `,
        el("span", { class: "muted" }, node.hostname)));
      const zygotes = node.zygotes || [];
      for (const d of node.devices) {
        const name = d.kind === "gpu" ? `GPU ${d.index}${d.mig_profile ? ` ${d.mig_profile}` : ""} ${d.name}` : d.name;
        const util = d.kind === "gpu" ? ` ${(d.utilization * 100).toFixed(0)}% busy` : "";
        const held = zygotes.filter((z) => d.kind === "gpu" ? (z.gpus || []).includes(d.uuid) : !(z.gpus || []).length);
        const chips = el("div", {}, ...d.replicas.map((id) => byId.get(id)).filter(Boolean).map(replicaChip),
          ...held.map(zygoteChip));
        const fault = d.fault ? el("div", { class: "fault" }, `out of service: ${d.fault}`) : "";
        card.append(el("div", { class: "device", "data-device": d.uuid || d.kind }, el("div", {}, name,
          el("span", { class: "muted" }, util), fault),
          el("div", {}, d.kind === "gpu" ? memoryBar(d) : "", chips)));
      }
      const placed = new Set(node.devices.flatMap((d) => d.replicas));
      const others = node.replicas.filter((r) => !placed.has(r.replica_id));
      if (others.length) card.append(el("div", {}, el("span", { class: "muted" }, "not on a device: "),
        ...others.map(replicaChip)));
      box.append(card);
    }
  }

  function renderStarts(status) {
    const box = $("starts");
    box.replaceChildren();
    const started = status.nodes.flatMap((n) => n.replicas.filter((r) => r.start).map((r) => ({ ...r, node: n.node_id })));
    if (started.length === 0) {
      box.append(el("p", { class: "muted" }, "No replica has reported a start yet."));
      return;
    }
    const scale = Math.max(...started.map((r) => r.start.ready_s), 1e-3);
    const table = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "replica"), el("th", {}, "kind"),
      el("th", {}, "phases"))));
    const body = el("tbody");
    for (const r of started) {
      body.append(el("tr", {}, el("td", {}, `${r.app}.${r.service} v${r.version} `, el("code", {}, r.replica_id)),
        el("td", {}, r.start.kind), el("td", {}, startBar(r.start, scale))));
    }
    table.append(body);
    const swatch = (phase) => {
      const box = svg("svg", { width: 10, height: 10, viewBox: "0 0 10 10" });
      box.append(svg("rect", { class: `phase-${phase}`, x: 0, y: 0, width: 10, height: 10 }));
      return box;
    };
    const legend = el("div", { class: "legend muted" }, ...PHASES.map((p) => el("span", {}, swatch(p), ` ${p}`)));
    box.append(table, legend);
  }

  function fillAppChoices() {
    for (const id of ["logs-app", "dead-app"]) {
      const select = $(id);
      const chosen = select.value;
      select.replaceChildren(...apps.map((a) => el("option", { value: a.app }, a.app)));
      if (apps.some((a) => a.app === chosen)) select.value = chosen;
    }
  }

  async function loadLogs() {
    const app = $("logs-app").value;
    if (!app) return;
    const lines = await api(`/v1/apps/${encodeURIComponent(app)}/logs?limit=200`);
    $("logs").textContent = lines.map((l) => `${time(l.ts)} ${l.replica_id.slice(0, 12)} ${l.stream}: ${l.line}`)
      .join("\n") || "(no output kept)";
  }

  async function loadDead() {
    const app = $("dead-app").value;
    const body = $("dead").tBodies[0];
    body.replaceChildren();
    if (!app) return;
    const letters = await api(`/v1/apps/${encodeURIComponent(app)}/dead?limit=100`);
    for (const d of letters) {
      const box = el("input", { type: "checkbox", "data-function": d.function, "data-call": d.call_id });
      body.append(el("tr", {}, el("td", {}, box), el("td", {}, d.function), el("td", {}, el("code", {}, d.call_id)),
        el("td", {}, `${d.error.code}: ${d.error.message}`), el("td", {}, d.attempts), el("td", {}, time(d.dead_at))));
    }
    if (!letters.length) body.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No dead letters.")));
  }

  async function replay() {
    const app = $("dead-app").value;
    const chosen = [...$("dead").querySelectorAll("input[type=checkbox]:checked")];
    const byFunction = new Map();
    for (const box of chosen) {
      const fn = box.getAttribute("data-function");
      byFunction.set(fn, [...(byFunction.get(fn) || []), box.getAttribute("data-call")]);
    }
    let replayed = 0;
    for (const [fn, ids] of byFunction) {
      const reply = await api(`/v1/apps/${encodeURIComponent(app)}/dead/replay`,
        { method: "POST", body: JSON.stringify({ function: fn, call_ids: ids }) });
      replayed += reply.replayed.length;
    }
    $("dead-result").textContent = `${replayed} replayed`;
    await loadDead();
  }

  // --- the loop ---------------------------------------------------------------------------------------------
  async function guarded(work) {
    try {
      await work();
      $("error").textContent = "";
    } catch (err) {
      if (err instanceof Unauthorized) signOut("The token was refused (revoked, expired or mistyped).");
      else $("error").textContent = String(err.message || err);
    }
  }

  async function refresh() {
    await guarded(async () => {
      // The schedules every SCHEDULES_EVERY polls: each row costs the control plane a read of its last call.
      const [stats, status, appList, schedules] = await Promise.all([api("/v1/stats"), api("/v1/status"),
        api("/v1/apps"), polls++ % SCHEDULES_EVERY === 0 ? api("/v1/schedules") : null]);
      apps = appList;
      renderTraffic(stats);
      renderApps(status);
      if (schedules) renderSchedules(schedules);
      renderNodes(status);
      renderStarts(status);
      fillAppChoices();
      $("updated").textContent = `updated ${time(stats.now)}`;
    });
  }

  async function start() {
    $("sign-in").hidden = true;
    $("console").hidden = false;
    $("sign-out").hidden = false;
    await guarded(async () => {
      const self = await api("/v1/tokens/self");
      $("who").textContent = `${self.name || self.id} (${(self.scopes || []).join(", ")})`;
    });
    await refresh();
    await guarded(async () => { await loadLogs(); await loadDead(); });
    if (!timer) timer = setInterval(refresh, POLL_MS);
  }

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    $("sign-in-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token-input").value.trim();
      $("token-input").value = "";
      if (value) {
        sessionStorage.setItem(KEY, value);
        start();
      }
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    $("logs-refresh").addEventListener("click", () => guarded(loadLogs));
    $("logs-app").addEventListener("change", () => guarded(loadLogs));
    $("dead-refresh").addEventListener("click", () => guarded(loadDead));
    $("dead-app").addEventListener("change", () => guarded(loadDead));
    $("dead-replay").addEventListener("click", () => guarded(replay));
    if (token()) start(); else signOut("");
  });
})();

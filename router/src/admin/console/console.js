// The Switchyard operator console. Plain browser JavaScript, no build step, no
// dependencies. Every data call goes to this same origin's admin API with the token
// from sessionStorage as `Authorization: Bearer`; the token never goes into a URL or
// a cookie. All server text is put into the page as text (textContent), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "switchyard.adminToken";
  const POLL_MS = 2000;
  // The charts span the server's activity history: at least 30 s, at most the ten
  // minutes the server keeps.
  const MIN_SPAN_MS = 30 * 1000;
  const MAX_SPAN_MS = 10 * 60 * 1000;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const $ = (id) => document.getElementById(id);
  let pollTimer = null;
  // Bumped on every start and stop, so that a poll still in flight from an earlier
  // sign-in does not start a second loop.
  let pollSession = 0;
  let busy = false;
  // What was last drawn, to redraw (and so disturb focus) only on change.
  const drawn = { overview: "", models: "", policy: "" };

  // ---- DOM helpers -------------------------------------------------------------

  /** An element with attributes (`on*` functions become listeners) and children. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") {
        node.addEventListener(key.slice(2), value);
      } else if (key === "class") {
        node.className = value;
      } else if (key === "dataset") {
        Object.assign(node.dataset, value);
      } else {
        node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    return node;
  }

  /** An id safe for the DOM from free text (model and version names). */
  function idPart(text) {
    return String(text).replace(/[^A-Za-z0-9_-]/g, (c) => "_" + c.charCodeAt(0).toString(16));
  }

  function bytes(n) {
    if (n === null || n === undefined) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = Number(n);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
  }

  function number(n, digits = 0) {
    if (n === null || n === undefined || Number.isNaN(n)) return "—";
    return Number(n).toLocaleString("en", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  }

  function duration(seconds) {
    if (seconds % 86400 === 0) return `${seconds / 86400} d`;
    if (seconds % 3600 === 0) return `${seconds / 3600} h`;
    if (seconds % 60 === 0) return `${seconds / 60} min`;
    return `${seconds} s`;
  }

  function clock(date) {
    return date.toLocaleTimeString("en-GB", { hour12: false });
  }

  /** A table whose rows turn into labelled cards on narrow windows. */
  function table(caption, headers, rows) {
    return el("table", { class: "rows" },
      el("caption", {}, caption),
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", class: h.num ? "num" : null }, h.label)))),
      el("tbody", {}, rows.map((row) => el("tr", { class: row.class || null },
        row.cells.map((cell, i) => el("td", { "data-label": headers[i].label, class: cell.class || (headers[i].num ? "num" : null) },
          el("span", {}, cell.content !== undefined ? cell.content : cell)))))));
  }

  function badge(text, kind) {
    return el("span", { class: `badge ${kind}` }, text);
  }

  /** Redraws `container` with `build()` when `key` changed, keeping keyboard focus. */
  function redraw(name, key, container, build) {
    if (drawn[name] === key) return;
    drawn[name] = key;
    const focused = document.activeElement && container.contains(document.activeElement)
      ? document.activeElement.id : null;
    container.replaceChildren(...[build()].flat());
    if (focused && $(focused)) $(focused).focus();
  }

  // ---- The admin API -----------------------------------------------------------

  class AuthError extends Error {}

  async function api(method, path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (!token) throw new AuthError("Not signed in.");
    const response = await fetch(path, {
      method,
      headers: { Authorization: `Bearer ${token}` },
      cache: "no-store",
      credentials: "omit",
      body: method === "POST" ? "" : undefined,
    });
    const text = await response.text();
    let body;
    try {
      body = text ? JSON.parse(text) : {};
    } catch {
      body = { text };
    }
    if (response.status === 401) {
      throw new AuthError(errorMessage(body) || "The server refused the admin token.");
    }
    return { status: response.status, ok: response.ok, statusText: response.statusText, body };
  }

  function errorMessage(body) {
    return body && body.error && body.error.message;
  }

  function notConfigured(result) {
    return result.status === 404 && result.body && result.body.error && result.body.error.code === "not_configured";
  }

  // ---- Sign in and out ---------------------------------------------------------

  function showSignIn(message) {
    stopPolling();
    sessionStorage.removeItem(TOKEN_KEY);
    for (const key of Object.keys(drawn)) drawn[key] = "";
    $("dashboard").hidden = true;
    $("sign-in").hidden = false;
    $("sign-out").hidden = true;
    $("connection").textContent = "Signed out";
    $("sign-in-error").textContent = message || "";
    $("token").value = "";
    $("token").focus();
  }

  async function signIn(event) {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) {
      $("sign-in-error").textContent = "Enter the admin token.";
      $("token").focus();
      return;
    }
    $("sign-in-button").disabled = true;
    $("sign-in-error").textContent = "";
    sessionStorage.setItem(TOKEN_KEY, token);
    try {
      const result = await api("GET", "/admin/activity");
      if (!result.ok) throw new Error(errorMessage(result.body) || `${result.status} ${result.statusText}`);
      showDashboard();
    } catch (error) {
      showSignIn(error instanceof AuthError
        ? `Refused: ${error.message}`
        : `Cannot reach the admin API: ${error.message}`);
    } finally {
      $("sign-in-button").disabled = false;
    }
  }

  function showDashboard() {
    $("token").value = "";
    $("sign-in").hidden = true;
    $("dashboard").hidden = false;
    $("sign-out").hidden = false;
    $("main").focus();
    startPolling();
  }

  // ---- Polling -----------------------------------------------------------------

  function startPolling() {
    stopPolling();
    poll(pollSession);
  }

  function stopPolling() {
    pollSession += 1;
    if (pollTimer) clearTimeout(pollTimer);
    pollTimer = null;
  }

  async function poll(session) {
    if (session !== pollSession) return;
    try {
      await refresh();
      if (session !== pollSession) return;
      if (!busy) $("connection").textContent = `Connected · updated ${clock(new Date())}`;
    } catch (error) {
      if (session !== pollSession) return;
      if (error instanceof AuthError) {
        showSignIn(`Signed out: ${error.message}`);
        return;
      }
      $("connection").textContent = `Cannot reach the admin API (${error.message}); retrying`;
    }
    if (session === pollSession) pollTimer = setTimeout(() => poll(session), POLL_MS);
  }

  async function refresh() {
    const since = Math.floor(Date.now() / 1000) - USAGE_WINDOW_S;
    const [models, status, activity, policy, usage] = await Promise.all([
      api("GET", "/admin/models"),
      api("GET", "/admin/status"),
      api("GET", "/admin/activity"),
      api("GET", "/admin/policy"),
      api("GET", `/admin/usage?since=${since}&limit=1000`),
    ]);
    renderOverview(models, status);
    renderModels(models);
    renderActivity(activity);
    renderPolicy(policy, usage);
  }

  // ---- Overview ----------------------------------------------------------------

  function renderOverview(models, status) {
    const memory = (status.ok && status.body.memory) || (models.ok && models.body.memory) || null;
    const executor = status.ok ? status.body.executor : null;
    const device = (status.ok && status.body.device) || (models.ok && models.body.device) || null;
    const key = JSON.stringify([memory, executor, device, status.status]);
    redraw("overview", key, $("overview"), () => {
      if (!memory || !executor) {
        return [stat("Models", notConfigured(status)
          ? "No model lifecycle on this server" : `Status unavailable (${status.status})`)];
      }
      const saved = memory.ram_bytes_without_sharing - memory.ram_bytes;
      return [
        stat("Weights on", device || "unknown"),
        stat("RAM resident", bytes(memory.ram_bytes)),
        stat("RAM budget", memory.ram_budget_bytes ? bytes(memory.ram_budget_bytes) : "no limit"),
        stat("Saved by sharing", bytes(Math.max(0, saved))),
        stat("On disk only", bytes(memory.disk_bytes)),
        stat("Versions in RAM / disk", `${memory.resident_versions} / ${memory.disk_versions}`),
        stat("Executor", executor.running ? "running" : "stopped"),
        stat("Queued", number(executor.queued)),
        stat("Running sequences", number(executor.active_sequences)),
        stat("Current checkpoint", executor.current_checkpoint || "none"),
        stat("Swaps / steps", `${number(executor.swaps)} / ${number(executor.steps)}`),
      ];
    });
    const bar = $("memory-bar");
    if (memory && memory.ram_budget_bytes) {
      const share = Math.min(100, (100 * memory.ram_bytes) / memory.ram_budget_bytes);
      bar.hidden = false;
      bar.setAttribute("role", "img");
      bar.setAttribute("aria-label", `RAM: ${share.toFixed(0)}% of the budget in use`);
      const fill = bar.firstElementChild || bar.appendChild(el("span"));
      fill.style.width = `${share}%`;
    } else {
      bar.hidden = true;
    }
  }

  function stat(label, value, wide) {
    return el("div", { class: wide ? "wide" : null }, el("dt", {}, label), el("dd", {}, value));
  }

  // ---- Models ------------------------------------------------------------------

  function renderModels(result) {
    const key = JSON.stringify([result.status, result.body]);
    redraw("models", key, $("models"), () => {
      if (notConfigured(result)) return el("p", {}, "This server has no model lifecycle (no engine adapter).");
      if (!result.ok) return el("p", { class: "error" }, errorMessage(result.body) || `Error ${result.status}`);
      const models = result.body.models || [];
      if (models.length === 0) return el("p", {}, "No models are registered.");
      return models.map(renderModel);
    });
  }

  function renderModel(model) {
    const history = model.rollback_history || [];
    const previous = history.length ? history[history.length - 1] : null;
    const head = el("div", { class: "model-head" },
      el("h3", {}, model.name),
      model.aliases && model.aliases.length ? el("span", { class: "subtle" }, `aliases: ${model.aliases.join(", ")}`) : null,
      el("span", {}, "active version: ", el("strong", { "data-active-version": model.name }, model.active_version || "none")),
      previous !== null
        ? el("button", {
          type: "button", class: "danger rollback", id: `rollback-${idPart(model.name)}`,
          dataset: { action: "rollback", model: model.name },
          "aria-label": `Roll back ${model.name} to version ${previous}`,
          onclick: () => runAction({
            title: `Roll back ${model.name}?`,
            text: `Version ${previous} becomes active again for ${model.name}; new requests go to it. Requests already running finish on the version they started on.`,
            method: "POST",
            path: `/admin/models/${encodeURIComponent(model.name)}/rollback`,
            ok: "Roll back",
            focusAfter: `rollback-${idPart(model.name)}`,
          }),
        }, `Roll back to ${previous}`)
        : null);
    const rows = (model.versions || []).map((v) => ({
      class: v.active ? "is-active" : null,
      cells: [
        el("strong", {}, v.version),
        badge(v.tier, v.tier),
        v.active ? badge("active", "active") : "",
        { content: bytes(v.bytes) },
        { content: v.shared_bytes ? bytes(v.shared_bytes) : "—" },
        { content: number(v.queued) },
        { content: number(Math.max(0, (v.in_flight || 0) - (v.queued || 0))) },
        { content: v.load_ms !== null && v.load_ms !== undefined ? `${number(v.load_ms)} ms` : "—" },
        { content: versionActions(model, v), class: "actions" },
        { content: el("span", { title: v.path }, v.last_error ? `${v.path} — last load failed: ${v.last_error}` : v.path), class: "path" },
      ],
    }));
    return el("article", { class: "model", "aria-labelledby": null, dataset: { model: model.name } },
      head,
      table(`Versions of ${model.name}`, [
        { label: "Version" }, { label: "Tier" }, { label: "Active" }, { label: "Size", num: true },
        { label: "Shared", num: true }, { label: "Queued", num: true }, { label: "Running", num: true },
        { label: "Last load", num: true }, { label: "Actions" }, { label: "Path" },
      ], rows));
  }

  function versionActions(model, v) {
    const name = `${model.name}@${v.version}`;
    const path = (action) => `/admin/models/${encodeURIComponent(model.name)}/versions/${encodeURIComponent(v.version)}/${action}`;
    const button = (action, label, cls, title, text) => {
      const id = `${action}-${idPart(model.name)}-${idPart(v.version)}`;
      return el("button", {
        type: "button", class: cls, id, "aria-label": `${label} ${name}`,
        dataset: { action, model: model.name, version: v.version },
        onclick: () => runAction({ title, text, method: "POST", path: path(action), ok: label, focusAfter: id }),
      }, label);
    };
    const buttons = [];
    // Resident: "ram" on the CPU, "device" in a GPU's memory; "host" is
    // pinned host memory, copied up to the GPU before it runs.
    const resident = v.tier === "ram" || v.tier === "device";
    if (v.tier === "disk" || v.tier === "host") {
      buttons.push(button("load", "Load", "secondary", `Load ${name}?`,
        `Reads ${name} (${bytes(v.bytes)} on disk) into RAM; a RAM budget may evict idle versions that are not active.`));
    }
    if (resident && !v.active) {
      buttons.push(button("activate", "Activate", null, `Activate ${name}?`,
        `New requests for ${model.name} go to version ${v.version}. Requests already running finish on the version they started on.`));
      buttons.push(button("unload", "Unload", "danger", `Unload ${name}?`,
        `Takes ${name} out of RAM once its running requests finish; requests naming it are then refused until it is loaded again.`));
    }
    return buttons.length ? buttons : el("span", { class: "subtle" }, v.active ? "serving" : "—");
  }

  // ---- Activity charts -----------------------------------------------------------

  function renderActivity(result) {
    if (!result.ok) return;
    const samples = result.body.samples || [];
    const rates = [];
    for (let i = 1; i < samples.length; i += 1) {
      const a = samples[i - 1];
      const b = samples[i];
      const seconds = (b.at_unix_ms - a.at_unix_ms) / 1000;
      if (seconds <= 0) continue;
      // A counter that went down means the server restarted: count from zero.
      const rate = (field) => Math.max(0, b[field] - a[field]) / seconds;
      rates.push({ t: b.at_unix_ms, throughput: rate("generated_tokens"), swaps: rate("swaps"), queued: b.queued, running: b.running });
    }
    const end = samples.length ? samples[samples.length - 1].at_unix_ms : Date.now();
    const first = samples.length ? samples[0].at_unix_ms : end;
    const span = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, end - first));
    const last = rates.length ? rates[rates.length - 1] : null;
    const frame = { end, span };
    drawChart("chart-throughput", rates, frame, [{ field: "throughput", cls: "throughput", label: "tokens/s" }],
      last ? `${number(last.throughput, 1)} tokens/s` : "no data yet", "tokens generated per second");
    drawChart("chart-swaps", rates, frame, [{ field: "swaps", cls: "swaps", label: "swaps/s" }],
      last ? `${number(last.swaps, 1)} swaps/s` : "no data yet", "weight-table swaps per second");
    drawChart("chart-load", rates, frame, [
      { field: "queued", cls: "queued", label: "queued" },
      { field: "running", cls: "running", label: "running" },
    ], last ? `${last.queued} queued · ${last.running} running` : "no data yet", "requests queued and sequences running");
  }

  function drawChart(id, rates, { end, span }, series, now, what) {
    const figure = $(id);
    figure.querySelector("[data-now]").textContent = now;
    const width = 300;
    const height = 90;
    const start = end - span;
    let max = 0;
    for (const r of rates) for (const s of series) max = Math.max(max, r[s.field]);
    // A round top so the grid lines read as round numbers.
    const top = niceTop(max);
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img" });
    for (const f of [0.25, 0.5, 0.75]) {
      chart.appendChild(svg("line", { class: "grid", x1: 0, x2: width, y1: height * f, y2: height * f }));
    }
    for (const s of series) {
      const points = rates
        .filter((r) => r.t >= start)
        .map((r) => `${(((r.t - start) / span) * width).toFixed(1)},${(height - (r[s.field] / top) * (height - 4) - 2).toFixed(1)}`);
      if (points.length) chart.appendChild(svg("polyline", { class: `series-${s.cls}`, points: points.join(" ") }));
    }
    const spanText = span < 60000 ? `${Math.round(span / 1000)} s` : `${Math.round(span / 60000)} min`;
    chart.setAttribute("aria-label", `${what} over the last ${spanText}: now ${now}; scale 0 to ${number(top, 1)}`);
    const scale = el("div", { class: "legend" },
      el("span", {}, `scale 0–${number(top, 1)}`),
      el("span", {}, `last ${spanText}`),
      series.length > 1 ? series.map((s) => el("span", {}, el("i", { class: s.cls }), s.label)) : null);
    const old = figure.querySelectorAll("svg, .legend");
    old.forEach((node) => node.remove());
    figure.append(chart, scale);
  }

  function niceTop(max) {
    if (max <= 0) return 1;
    const power = 10 ** Math.floor(Math.log10(max));
    for (const step of [1, 2, 2.5, 5, 10]) if (max <= step * power) return step * power;
    return 10 * power;
  }

  // ---- Routing policy --------------------------------------------------------------

  // The usage ledger's recent records (JSON lines), newest first.
  const USAGE_WINDOW_S = 300;
  function recentUsage(result) {
    if (!result || !result.ok || !result.body) return [];
    // One line alone parses as a JSON object.
    if (typeof result.body.time_ms === "number") return [result.body];
    if (typeof result.body.text !== "string") return [];
    const records = [];
    for (const line of result.body.text.split("\n")) {
      if (!line) continue;
      try { records.push(JSON.parse(line)); } catch { /* a partial line: skip it */ }
    }
    return records.slice(-10).reverse();
  }

  function renderPolicy(result, usage) {
    const records = recentUsage(usage);
    const key = JSON.stringify([result.status, result.body, records]);
    redraw("policy", key, $("policy"), () => {
      if (notConfigured(result)) {
        return el("p", {}, "No routing policy is configured: each request goes to its model's active version. Start ",
          el("code", {}, "switchyard serve"), " with ", el("code", {}, "--policy FILE"),
          " to route by tenant, budget and split.");
      }
      if (!result.ok) return el("p", { class: "error" }, errorMessage(result.body) || `Error ${result.status}`);
      const p = result.body;
      const parts = [];
      parts.push(el("dl", { class: "stats" },
        stat("Source", p.source || "—", true),
        stat("Generation", number(p.generation)),
        stat("Models", number((p.models || []).length)),
        stat("Last reload error", p.last_reload_error || "none")));
      if (p.file) {
        parts.push(el("p", {}, el("button", {
          type: "button", class: "secondary", id: "policy-reload", dataset: { action: "policy-reload" },
          onclick: () => runAction({
            title: "Reload the policy file?",
            text: `Re-reads ${p.file}. It is validated whole: if it is invalid the current policy stays in force and the answer lists every problem.`,
            method: "POST", path: "/admin/policy/reload", ok: "Reload", focusAfter: "policy-reload",
          }),
        }, "Reload policy file")));
      }
      parts.push(el("h3", {}, "Tenants and budgets"));
      const budgetRows = [];
      for (const tenant of p.tenants || []) {
        if (!tenant.budgets || tenant.budgets.length === 0) {
          budgetRows.push({ cells: [el("strong", {}, tenant.name), "no budget", { content: "—" }, { content: "—" }, ""] });
        }
        for (const b of tenant.budgets || []) {
          const unit = b.unit === "cost" ? "cost" : "tokens";
          const spent = b.settled + b.reserved;
          const fmt = (x) => (unit === "cost" ? number(x, 4) : number(x));
          budgetRows.push({
            cells: [
              el("strong", {}, tenant.name),
              `${unit} per ${duration(b.window_secs)}`,
              { content: `${fmt(spent)} of ${fmt(b.limit)}` },
              { content: fmt(b.remaining) },
              el("meter", { min: 0, max: b.limit, value: Math.min(spent, b.limit), high: b.limit * 0.8, "aria-label": `${tenant.name}: ${fmt(spent)} of ${fmt(b.limit)} ${unit} spent` }),
            ],
          });
        }
      }
      parts.push(budgetRows.length
        ? table("Spend in the current window (settled and reserved)", [
          { label: "Tenant" }, { label: "Budget" }, { label: "Spent", num: true }, { label: "Remaining", num: true }, { label: "Use" },
        ], budgetRows)
        : el("p", { class: "subtle" }, "No tenants."));
      parts.push(el("h3", {}, "Recent usage"));
      parts.push(records.length
        ? table("The last settled requests (GET /admin/usage exports every one as JSON lines or CSV)", [
          { label: "Time" }, { label: "Tenant" }, { label: "Checkpoint" }, { label: "Tokens in", num: true },
          { label: "Tokens out", num: true }, { label: "Cost", num: true },
        ], records.map((r) => ({
          cells: [
            new Date(r.time_ms).toLocaleTimeString(),
            r.tenant || "anonymous",
            `${r.model}@${r.version}`,
            { content: number(r.tokens_in) },
            { content: number(r.tokens_out) },
            { content: number(r.cost, 6) },
          ],
        })))
        : el("p", { class: "subtle" }, `No request settled in the last ${USAGE_WINDOW_S / 60} minutes.`));
      parts.push(el("h3", {}, "Splits"));
      const rollback = new Map((p.rollback || []).map((r) => [r.split, r]));
      const splitRows = (p.splits || []).map((s) => {
        const rule = rollback.get(s.name);
        return {
          cells: [
            el("strong", {}, s.name),
            s.model || "—",
            s.sticky,
            el("ul", { class: "arms" }, (s.arms || []).map((a) => el("li", {}, `${a.name} → ${a.target || "?"}: ${a.weight}%`))),
            rule ? rollbackCell(s.name, rule) : "no rollback rule",
          ],
        };
      });
      parts.push(splitRows.length
        ? table("Traffic splits and their rollback rules", [
          { label: "Split" }, { label: "Model" }, { label: "Sticky" }, { label: "Arms" }, { label: "Rollback" },
        ], splitRows)
        : el("p", { class: "subtle" }, "No splits."));
      parts.push(el("h3", {}, "Answer quality"));
      const signals = p.quality_signals || [];
      const meanCell = (m, digits) => ({ content: m ? `${m.mean.toFixed(digits)} [${m.ci95[0].toFixed(digits)}, ${m.ci95[1].toFixed(digits)}] (n ${m.n})` : "—" });
      parts.push(signals.length
        ? table("Per checkpoint and split arm: client scores (POST /v1/feedback) and the engine's confidence (mean token log-probability)", [
          { label: "Checkpoint" }, { label: "Arm" }, { label: "Client score", num: true }, { label: "Confidence", num: true },
        ], signals.map((q) => ({
          cells: [q.checkpoint, q.arm || "—", meanCell(q.feedback, 2), meanCell(q.confidence, 2)],
        })))
        : el("p", { class: "subtle" }, "No answers recorded yet."));
      return parts;
    });
  }

  /** `; NAME m [lo, hi] (n N)` for a quality signal's mean, or nothing without one. */
  function quality(name, mean) {
    if (!mean) return "";
    const f = (x) => x.toFixed(2);
    return `; ${name} ${f(mean.mean)} [${f(mean.ci95[0])}, ${f(mean.ci95[1])}] (n ${mean.n})`;
  }

  function rollbackCell(split, rule) {
    const state = rule.state && rule.state.state;
    const arm = (a) => `${a.arm}: ${a.samples} requests, ${(100 * a.error_rate).toFixed(1)}% errors, ${number(a.mean_latency_ms)} ms mean`
      + quality("mean log-prob", a.confidence) + quality("client score", a.feedback);
    const id = `reset-${idPart(split)}`;
    return el("div", {},
      badge(state === "rolled_back" ? "rolled back" : "watching", state || "watching"),
      state === "rolled_back" ? el("p", {}, rule.state.reason, " (", clock(new Date(rule.state.at_unix_ms)), ")") : null,
      el("div", { class: "subtle" }, `baseline ${arm(rule.baseline)}`),
      el("div", { class: "subtle" }, `candidate ${arm(rule.candidate)}`),
      state === "rolled_back"
        ? el("button", {
          type: "button", class: "secondary", id, dataset: { action: "reset-split", split },
          onclick: () => runAction({
            title: `Reset the rollback of ${split}?`,
            text: `The split's weights apply again and the rule goes back to watching ${rule.candidate.arm}.`,
            method: "POST", path: `/admin/policy/splits/${encodeURIComponent(split)}/reset`, ok: "Reset", focusAfter: id,
          }),
        }, "Reset rollback")
        : null);
  }

  // ---- Actions -----------------------------------------------------------------------

  /** Asks for confirmation in a modal dialog; resolves to true when confirmed. */
  function confirmDialog({ title, text, method, path, ok }) {
    const dialog = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-request").textContent = `${method} ${path}`;
    $("confirm-ok").textContent = ok;
    return new Promise((resolve) => {
      const finish = (answer) => {
        $("confirm-ok").removeEventListener("click", onOk);
        $("confirm-cancel").removeEventListener("click", onCancel);
        dialog.removeEventListener("cancel", onCancel);
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      const onOk = () => finish(true);
      const onCancel = (event) => {
        if (event) event.preventDefault();
        finish(false);
      };
      $("confirm-ok").addEventListener("click", onOk);
      $("confirm-cancel").addEventListener("click", onCancel);
      dialog.addEventListener("cancel", onCancel);
      dialog.showModal();
      // The safe choice has the focus; Tab reaches the confirm button.
      $("confirm-cancel").focus();
    });
  }

  async function runAction(action) {
    if (busy) return;
    const confirmed = await confirmDialog(action);
    if (!confirmed) {
      refocus(action.focusAfter);
      return;
    }
    busy = true;
    $("connection").textContent = `Working: ${action.method} ${action.path}…`;
    const started = new Date();
    let entry;
    try {
      const result = await api(action.method, action.path);
      entry = logEntry(started, action, `${result.status} ${result.statusText || (result.ok ? "OK" : "")}`.trim(),
        result.ok, result.ok ? JSON.stringify(result.body, null, 2) : errorMessage(result.body) || JSON.stringify(result.body));
    } catch (error) {
      if (error instanceof AuthError) {
        busy = false;
        showSignIn(`Signed out: ${error.message}`);
        return;
      }
      entry = logEntry(started, action, "no answer", false, error.message);
    } finally {
      busy = false;
    }
    $("log").prepend(entry);
    $("connection").textContent = entry.querySelector(".what").textContent;
    try {
      await refresh();
    } catch (error) {
      if (error instanceof AuthError) {
        showSignIn(`Signed out: ${error.message}`);
        return;
      }
    }
    refocus(action.focusAfter);
  }

  /** Focus back on the action's button, or, where the action removed it (an activated
   * version has no Activate button), on the server's answer. */
  function refocus(id) {
    const target = (id && $(id)) || $("log").firstElementChild || $("log");
    target.focus();
  }

  function logEntry(when, action, status, ok, detail) {
    return el("li", { class: ok ? "ok" : "failed", tabindex: "-1", dataset: { ok: String(ok) } },
      el("span", { class: "what" }, `${clock(when)} ${action.method} ${action.path} → ${status}`),
      el("pre", {}, detail));
  }

  // ---- Start -------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("log").setAttribute("tabindex", "-1");
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", () => showSignIn("Signed out."));
    if (sessionStorage.getItem(TOKEN_KEY)) {
      $("sign-in").hidden = true;
      showDashboard();
    } else {
      $("token").focus();
    }
  });
})();

// Orrery explain page: plain JavaScript over the public API of the server that served
// it. Keys live in this tab's sessionStorage and travel only as headers (x-api-key,
// x-admin-key): never in a URL. Every value from the server is set as text (no HTML).
"use strict";

const COMPONENTS = ["lexical", "vector", "freshness", "metadata"];
const STAGES = ["scope_resolve", "candidate_fetch", "index_search", "rerank", "payload_materialize"];
const SOURCE_DEPTH = 100;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function keys() {
  return {
    api: sessionStorage.getItem("orrery.apiKey") || "",
    admin: sessionStorage.getItem("orrery.adminKey") || "",
  };
}

async function call(method, path, body, admin) {
  const headers = { accept: "application/json" };
  const k = keys();
  if (admin) { if (k.admin) headers["x-admin-key"] = k.admin; }
  else if (k.api) headers["x-api-key"] = k.api;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store",
  });
  let data = null;
  try { data = await response.json(); } catch (_) { data = null; }
  if (!response.ok) {
    const error = (data && data.error) || {};
    const failure = new Error(`${error.code || response.status}: ${error.message || response.statusText}`);
    failure.status = response.status;
    throw failure;
  }
  return data;
}

function showError(out, error) {
  out.replaceChildren(el("p", { class: "error", role: "alert", text: error.message }));
}

function fmt(value, digits = 3) {
  return typeof value === "number" ? value.toFixed(digits) : "";
}

function formData(form) {
  const data = {};
  for (const [key, value] of new FormData(form).entries()) data[key] = String(value).trim();
  return data;
}

function titleOf(result) {
  const content = result.content || {};
  const payload = result.payload || {};
  for (const value of [content.title, payload.title, payload.summary, content.body]) {
    if (typeof value === "string" && value.trim()) return value.trim();
  }
  return result.item_id;
}

function topkBody(data, profile, scopeRef) {
  const body = {
    namespace: data.namespace,
    scope_ref: scopeRef || data.scope_ref,
    query_text: data.query_text,
    result_limit: Number(data.result_limit || 10),
    include: { content: true },
  };
  if (profile) body.profile = profile;
  if (data.filters) body.filters = JSON.parse(data.filters);
  return body;
}

// Each source's own ranking: the generic retrieve with only that source's weight.
async function sourceRanks(body) {
  const ranks = {};
  for (const source of ["lexical", "vector"]) {
    const ranking = { lexical_weight: 0, vector_weight: 0, freshness_weight: 0, metadata_weight: 0 };
    ranking[`${source}_weight`] = 1;
    const request = {
      namespace: body.namespace, scope_ref: body.scope_ref, query_text: body.query_text,
      limit: SOURCE_DEPTH, ranking,
    };
    if (body.profile) request.profile = body.profile;
    if (body.filters) request.filters = body.filters;
    const answer = await call("POST", "/v1/external/retrieve", request);
    const scored = answer.candidates.filter((c) => c.score_breakdown[source] > 0);
    ranks[source] = new Map(scored.map((c, i) => [c.document_id, i + 1]));
  }
  return ranks;
}

function latencyBar(latency) {
  const total = STAGES.reduce((sum, s) => sum + (latency[s] || 0), 0) || 1;
  const stack = el("div", { class: "stack", role: "img",
    "aria-label": `latency ${fmt(latency.total, 2)} ms: ` + STAGES.map((s) => `${s} ${fmt(latency[s], 2)} ms`).join(", ") });
  const legend = el("div", { class: "legend" });
  STAGES.forEach((stage, i) => {
    const ms = latency[stage] || 0;
    stack.append(el("span", { style: `width:${(100 * ms) / total}%;background:var(--stage-${i})`, title: `${stage} ${fmt(ms, 2)} ms` }));
    legend.append(el("span", {}, el("i", { style: `background:var(--stage-${i})` }), `${stage} ${fmt(ms, 2)} ms`));
  });
  return el("div", { class: "latency" }, el("h2", { text: `Latency ${fmt(latency.total, 2)} ms` }), stack, legend);
}

function resultCard(result, ranks) {
  const parts = result.score_breakdown || {};
  const bars = el("div", { class: "bars", role: "table", "aria-label": `score parts of rank ${result.rank}` });
  for (const component of COMPONENTS) {
    const value = parts[component] || 0;
    const own = ranks && ranks[component] ? ranks[component].get(result.document_id) : undefined;
    const ownText = ranks && ranks[component] ? (own ? `own #${own}` : `own >${SOURCE_DEPTH}`) : "";
    bars.append(
      el("span", { role: "rowheader", text: component }),
      el("div", { class: `bar ${component}`, role: "meter", "aria-valuemin": "0", "aria-valuemax": "1",
        "aria-valuenow": fmt(value), "aria-label": `${component} ${fmt(value)}` },
        el("span", { style: `width:${Math.max(0, Math.min(1, value)) * 100}%` })),
      el("span", { role: "cell", text: fmt(value) }),
      el("span", { role: "cell", class: "own-rank", "data-source": component, text: ownText }),
    );
  }
  return el("article", { class: "result", "data-item": result.item_id, "data-rank": String(result.rank) },
    el("div", { class: "head" },
      el("span", { class: "rank", text: `#${result.rank}` }),
      el("strong", { class: "title", text: titleOf(result) }),
      el("span", { class: "fused", text: `fused ${fmt(result.score)}` })),
    el("div", { class: "item", text: result.item_id }),
    bars,
    el("details", {}, el("summary", { text: "payload" }), el("pre", { text: JSON.stringify(result.payload, null, 2) })));
}

async function runSearch(event) {
  event.preventDefault();
  const out = document.getElementById("search-out");
  out.replaceChildren(el("p", { text: "searching…" }));
  try {
    const data = formData(event.target);
    const body = topkBody(data, data.profile);
    const answer = await call("POST", "/v1/external/retrieve/topk_records", body);
    const ranks = await sourceRanks(body);
    const plan = answer.query_plan || {};
    const meta = el("div", { class: "meta", id: "search-meta" },
      el("span", {}, el("b", { text: "generation " }), answer.generation_id),
      el("span", {}, el("b", { text: "profile " }), answer.profile),
      el("span", { id: "cache-state" }, el("b", { text: "cache " }), plan.cache || ""),
      el("span", {}, el("b", { text: "candidates " }), `${plan.candidate_count} (` +
        Object.entries(plan.source_counts || {}).map(([k, v]) => `${k} ${v}`).join(", ") + ")"),
      el("span", {}, el("b", { text: "indexes " }), (plan.indexes_used || []).join(", ")));
    const list = el("div", { id: "results" }, answer.results.map((r) => resultCard(r, ranks)));
    const phrase = el("details", { id: "phrase-plan" }, el("summary", { text: "phrase plan" }),
      el("pre", { text: plan.phrase_plan ? JSON.stringify(plan.phrase_plan, null, 2) : "no phrase plan in this request" }));
    out.replaceChildren(meta, latencyBar(plan.latency_ms || {}), phrase,
      answer.results.length ? list : el("p", { text: "no results" }));
  } catch (error) { showError(out, error); }
}

async function runCompare(event) {
  event.preventDefault();
  const out = document.getElementById("compare-out");
  out.replaceChildren(el("p", { text: "comparing…" }));
  try {
    const data = formData(event.target);
    const k = Number(data.result_limit || 10);
    const [a, b] = await Promise.all([
      call("POST", "/v1/external/retrieve/topk_records", topkBody(data, data.profile_a, data.scope_a)),
      call("POST", "/v1/external/retrieve/topk_records", topkBody(data, data.profile_b, data.scope_b)),
    ]);
    const idsA = a.results.map((r) => r.document_id);
    const idsB = b.results.map((r) => r.document_id);
    const shared = idsA.slice(0, k).filter((id) => idsB.slice(0, k).includes(id)).length;
    const column = (answer, other, side) => el("ol", { class: `side-${side}`, "aria-label": `${answer.generation_id} ${answer.profile}` },
      answer.results.map((r) => {
        const tag = other.includes(r.document_id) ? null
          : el("span", { class: `tag ${side === "a" ? "gone" : "new"}`, text: side === "a" ? "gone" : "new" });
        return el("li", { "data-doc": r.document_id }, el("b", { text: `${r.rank}` }), el("span", { class: "t", text: titleOf(r) }), tag);
      }));
    const rows = Math.max(idsA.length, idsB.length, 1);
    const lines = svg("svg", { viewBox: `0 0 100 ${rows * 10}`, preserveAspectRatio: "none", "aria-hidden": "true", id: "rank-lines" });
    idsA.forEach((id, i) => {
      const j = idsB.indexOf(id);
      if (j < 0) return;
      const kind = j < i ? "up" : j > i ? "down" : "same";
      lines.append(svg("line", { x1: 0, y1: i * 10 + 5, x2: 100, y2: j * 10 + 5, class: kind, "stroke-width": 1.2, "vector-effect": "non-scaling-stroke", "data-doc": id }));
    });
    const heading = el("p", { class: "meta", id: "overlap" },
      el("span", {}, el("b", { text: "left " }), `${a.scope_ref} · ${a.generation_id} · ${a.profile}`),
      el("span", {}, el("b", { text: "right " }), `${b.scope_ref} · ${b.generation_id} · ${b.profile}`),
      el("span", {}, el("b", { text: `overlap@${k} ` }), fmt(shared / k, 2)));
    out.replaceChildren(heading, el("div", { class: "compare" }, column(a, idsB, "a"), lines, column(b, idsA, "b")));
  } catch (error) { showError(out, error); }
}

async function runEnvelope(event, planOnly) {
  if (event) event.preventDefault();
  const form = document.getElementById("envelope-form");
  const out = document.getElementById("envelope-out");
  out.replaceChildren(el("p", { text: "asking…" }));
  try {
    const data = formData(form);
    const body = { namespace: data.namespace, galaxy: data.galaxy || "default", queryText: data.queryText,
      amount: data.amount, scope: data.scope, depth: data.depth };
    if (data.ring) body.ring = data.ring;
    const envelope = await call("POST", planOnly ? "/v1/koutendb/plan" : "/v1/koutendb/retrieve", body);
    const plan = envelope.plan || envelope;
    const selected = new Set(plan.selectedRings || []);
    const rings = el("div", { class: "rings", id: "rings", role: "list", "aria-label": "rings" },
      (plan.ringFeatures || []).map((f) => el("span", {
        class: `ring ${selected.has(f.ring) ? "selected" : "pruned"}`, role: "listitem", "data-ring": f.ring,
        title: `centroid score ${fmt(f.centroidScore)}`,
        text: `${f.ring} · ${selected.has(f.ring) ? "selected" : "pruned"} · ${fmt(f.centroidScore, 2)}`,
      })));
    const stats = envelope.stats || {};
    const meta = el("div", { class: "meta" },
      el("span", {}, el("b", { text: "strategy " }), plan.strategy || ""),
      el("span", {}, el("b", { text: "budget " }), String(plan.budget ?? "")),
      el("span", {}, el("b", { text: "selected " }), String((plan.selectedRings || []).length)),
      el("span", {}, el("b", { text: "pruned " }), String((plan.prunedRings || []).length)),
      stats.totalVectors !== undefined ? el("span", {}, el("b", { text: "scanned " }), `${stats.scanned} of ${stats.totalVectors}`) : null,
      el("span", {}, el("b", { text: "reason " }), plan.reason || ""));
    const parts = [meta, el("h2", { text: "Rings" }), rings];
    if (!planOnly) {
      const requestId = (envelope.trace || {}).requestId;
      const feedback = el("p", { id: "feedback-state", role: "status", "aria-live": "polite" });
      const marks = new Map();
      const table = el("table", {}, el("thead", {}, el("tr", {}, ["#", "chunk", "ring", "score", "feedback"].map((h) => el("th", { text: h })))),
        el("tbody", {}, (envelope.chunks || []).map((chunk, i) => {
          const choose = (used) => () => { marks.set(chunk.id, used); feedback.textContent = `${[...marks.values()].filter(Boolean).length} used, ${[...marks.values()].filter((v) => !v).length} ignored (not sent yet)`; };
          return el("tr", {}, el("td", { text: String(i + 1) }), el("td", { class: "item", text: chunk.id }), el("td", { text: chunk.ring }),
            el("td", { text: fmt(chunk.score) }),
            el("td", { class: "actions" }, el("button", { type: "button", class: "secondary", onclick: choose(true), text: "used" }),
              el("button", { type: "button", class: "secondary", onclick: choose(false), text: "ignored" })));
        })));
      const send = el("button", { type: "button", text: "Send feedback", onclick: async () => {
        try {
          const used = [...marks].filter(([, v]) => v).map(([id]) => id);
          const ignored = [...marks].filter(([, v]) => !v).map(([id]) => id);
          await call("POST", "/v1/koutendb/feedback", { namespace: data.namespace, requestId, usedChunkIds: used, ignoredChunkIds: ignored });
          feedback.textContent = `feedback kept for ${requestId}: ${used.length} used, ${ignored.length} ignored`;
        } catch (error) { feedback.textContent = error.message; }
      } });
      parts.push(el("h2", { text: `Chunks (request ${requestId})` }), el("div", { class: "table-wrap" }, table), send, feedback);
    }
    out.replaceChildren(...parts);
  } catch (error) { showError(out, error); }
}

async function showGeneration(id) {
  const out = document.getElementById("generation-detail");
  try {
    const view = await call("GET", `/v1/admin/generations/${encodeURIComponent(id)}`, undefined, true);
    const checks = view.checks || [];
    out.replaceChildren(el("h2", { text: `${id} · ${view.row.state}` }),
      el("h2", { text: "Verify results" }),
      checks.length ? el("ul", {}, checks.map((c) => el("li", { text: `${c.kind}: ${c.ok ? "ok" : "FAILED"} — ${c.reason || ""}` }))) : el("p", { text: "no checks yet" }),
      el("details", { open: "" }, el("summary", { text: "descriptor evidence and history" }),
        el("pre", { text: JSON.stringify({ evidence: view.descriptor.evidence, history: view.descriptor.history }, null, 2) })));
  } catch (error) { showError(out, error); }
}

async function adminAction(label, path, body) {
  const out = document.getElementById("generation-detail");
  out.replaceChildren(el("p", { text: `${label}…` }));
  try {
    const answer = await call("POST", path, body, true);
    out.replaceChildren(el("h2", { text: `${label}: done` }), el("pre", { id: "admin-report", text: JSON.stringify(answer, null, 2) }));
    await listGenerations();
  } catch (error) { showError(out, error); }
}

async function listGenerations(event) {
  if (event) event.preventDefault();
  const out = document.getElementById("generations-out");
  try {
    const namespace = formData(document.getElementById("generations-form")).namespace;
    const query = namespace ? `?namespace=${encodeURIComponent(namespace)}` : "";
    const answer = await call("GET", `/v1/admin/generations${query}`, undefined, true);
    const scopes = new Map();
    for (const row of answer.generations) {
      const key = `${row.namespace}/${row.snapshot_kind}`;
      if (!scopes.has(key)) scopes.set(key, []);
      scopes.get(key).push(row);
    }
    const sections = [...scopes].map(([key, rows]) => {
      const [ns, kind] = key.split("/");
      return el("section", { "data-scope": key }, el("h2", {}, key, " ",
        el("button", { type: "button", class: "secondary", text: "Roll back", "aria-label": `roll back ${key}`,
          onclick: () => adminAction(`rollback ${key}`, "/v1/admin/generations/rollback", { namespace: ns, snapshot_kind: kind }) })),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ["generation", "state", "documents", "created", "actions"].map((h) => el("th", { text: h })))),
        el("tbody", {}, rows.map((row) => el("tr", { "data-generation": row.generation_id },
          el("td", {}, el("button", { type: "button", class: "secondary", text: row.generation_id, onclick: () => showGeneration(row.generation_id) })),
          el("td", { class: `state-${row.state}`, text: row.live && row.state !== "live" ? `${row.state} (live pointer)` : row.state }),
          el("td", { text: String(row.document_count) }),
          el("td", { text: row.created_at }),
          el("td", { class: "actions" },
            el("button", { type: "button", class: "secondary", text: "Verify", "aria-label": `verify ${row.generation_id}`,
              onclick: () => adminAction(`verify ${row.generation_id}`, `/v1/admin/generations/${row.generation_id}/verify`) }),
            el("button", { type: "button", text: "Promote", "aria-label": `promote ${row.generation_id}`, disabled: row.live ? "" : null,
              onclick: () => adminAction(`promote ${row.generation_id}`, `/v1/admin/generations/${row.generation_id}/promote`) }))))))));
    });
    out.replaceChildren(...(sections.length ? sections : [el("p", { text: "no generations" })]));
  } catch (error) { showError(out, error); }
}

async function loadScopes() {
  try {
    const answer = await call("GET", "/v1/scopes");
    const list = document.getElementById("scope-refs");
    const refs = new Set(answer.namespaces.flatMap((n) => n.scopes.map((s) => s.scope_ref)));
    list.replaceChildren(...[...refs].map((ref) => el("option", { value: ref })));
  } catch (_) { /* a key may be needed first */ }
}

function selectTab(tab) {
  for (const other of document.querySelectorAll('[role="tab"]')) {
    const selected = other === tab;
    other.setAttribute("aria-selected", String(selected));
    other.tabIndex = selected ? 0 : -1;
    document.getElementById(other.getAttribute("aria-controls")).hidden = !selected;
  }
  tab.focus();
}

function setup() {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => selectTab(tab));
    tab.addEventListener("keydown", (event) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      if (step) { event.preventDefault(); selectTab(tabs[(i + step + tabs.length) % tabs.length]); }
    });
  });
  const k = keys();
  document.getElementById("api-key").value = k.api;
  document.getElementById("admin-key").value = k.admin;
  document.getElementById("keys").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("orrery.apiKey", document.getElementById("api-key").value);
    sessionStorage.setItem("orrery.adminKey", document.getElementById("admin-key").value);
    document.getElementById("keys-state").textContent = "kept in this tab only";
    loadScopes();
  });
  document.getElementById("search-form").addEventListener("submit", runSearch);
  document.getElementById("compare-form").addEventListener("submit", runCompare);
  document.getElementById("envelope-form").addEventListener("submit", (event) => runEnvelope(event, false));
  document.getElementById("envelope-plan").addEventListener("click", () => runEnvelope(null, true));
  document.getElementById("generations-form").addEventListener("submit", listGenerations);
  loadScopes();
}

document.addEventListener("DOMContentLoaded", setup);

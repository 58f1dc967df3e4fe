// The cache page: polls /cache_tree and draws it with ECharts (vendored: echarts.min.js).
"use strict";

const POLL_MS = 2000;
const MAX_NODES = 300;
const RECENT_ACCESSES = 20; // "hit recently": within this many accesses of the tree's newest
const HISTORY_MS = 10 * 60 * 1000; // the server keeps the last 10 minutes
const enc = echarts.format.encodeHTML;

const charts = {};
for (const id of ["tree", "kv", "hits", "throughput", "queue", "accept"]) {
  charts[id] = echarts.init(document.getElementById(id), null, { renderer: "svg" });
}
window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.resize()));

function nodeColor(node, clock) {
  if (node.locked) return "#e53935";
  if (clock - node.last_access <= RECENT_ACCESSES) return "#43a047";
  return "#90a4ae";
}

// flat nodes (parents first) -> the nested data of an ECharts tree series
function toTree(tree) {
  const byId = new Map();
  let root = null;
  for (const n of tree.nodes) {
    const isRoot = n.parent === null;
    const item = {
      name: isRoot ? "root" : String(n.num_tokens),
      value: n.num_tokens,
      node: n,
      children: [],
      itemStyle: { color: isRoot ? "#263238" : nodeColor(n, tree.clock) },
    };
    byId.set(n.id, item);
    if (isRoot) root = item;
    else byId.get(n.parent).children.push(item);
    if (n.hidden_children > 0) {
      item.children.push({
        name: "+" + n.hidden_children,
        value: n.hidden_tokens,
        summary: n,
        itemStyle: { color: "#ffb300" },
      });
    }
  }
  return root;
}

function tooltip(params) {
  const d = params.data;
  if (d.summary) {
    return `${d.summary.hidden_children} nodes left out<br>${d.summary.hidden_tokens} tokens`;
  }
  const n = d.node;
  if (n.parent === null) return `root: ${n.subtree_tokens} tokens cached`;
  const state = n.locked ? `locked (${n.lock_ref})` : "evictable";
  const text = n.text === null
    ? "<i>text shown to an admin API key only</i>"
    : enc(n.text) + (n.num_tokens > 32 ? "&hellip;" : "");
  return `<div style="max-width:420px;white-space:pre-wrap">${n.num_tokens} tokens, ` +
    `${n.subtree_tokens} below; ${state}<br>last access ${n.last_access}` +
    (n.adapter ? `<br>LoRA adapter ${enc(n.adapter)}` : "") +
    (n.extra_key ? `<br>namespace ${enc(n.extra_key)}` : "") + `<hr>${text}</div>`;
}

function drawTree(tree) {
  const root = toTree(tree);
  charts.tree.setOption({
    tooltip: { trigger: "item", formatter: tooltip, confine: true },
    series: [{
      type: "tree",
      data: root ? [root] : [],
      top: "2%", bottom: "2%", left: "6%", right: "12%",
      symbolSize: (v) => 6 + Math.min(14, Math.log2(1 + (v || 0))),
      initialTreeDepth: -1,
      expandAndCollapse: false,
      animation: false,
      label: { position: "left", verticalAlign: "middle", fontSize: 11 },
      leaves: { label: { position: "right", align: "left" } },
    }],
  }, { replaceMerge: ["series"] });
}

function lineOption(series, yMax) {
  return {
    animation: false,
    grid: { left: 48, right: 12, top: 24, bottom: 24 },
    legend: { top: 0, textStyle: { fontSize: 11 } },
    tooltip: { trigger: "axis" },
    xAxis: { type: "time", min: Date.now() - HISTORY_MS, max: Date.now() },
    yAxis: { type: "value", max: yMax },
    series: series.map(([name, data]) => ({ name, type: "line", showSymbol: false, data })),
  };
}

function drawStats(data) {
  const kv = data.kv;
  charts.kv.setOption({
    animation: false,
    tooltip: { trigger: "item" },
    legend: { bottom: 0, textStyle: { fontSize: 11 } },
    series: [{
      type: "pie", radius: ["40%", "70%"], center: ["50%", "45%"], label: { show: false },
      data: [
        { name: "in use", value: kv.in_use, itemStyle: { color: "#e53935" } },
        { name: "cached", value: kv.cached, itemStyle: { color: "#43a047" } },
        { name: "free", value: kv.free, itemStyle: { color: "#cfd8dc" } },
      ],
    }],
  });
  const at = (key) => data.history.map((p) => [p.t * 1000, p[key]]);
  charts.hits.setOption(lineOption([["hit rate", at("hit_rate")]], 1));
  charts.throughput.setOption(lineOption([
    ["prompt", at("prompt_tokens_per_s")],
    ["generated", at("generated_tokens_per_s")],
  ]));
  charts.queue.setOption(lineOption([["running", at("running")], ["waiting", at("waiting")]]));
  document.getElementById("running").textContent = data.running;
  document.getElementById("waiting").textContent = data.waiting;
  document.getElementById("hit-rate").textContent = (100 * data.cache_hit_rate).toFixed(1) + "%";
  const t = data.tree;
  document.getElementById("tree-size").textContent = t.disabled
    ? "disabled" : `${t.shown_nodes}/${t.total_nodes} nodes, ${t.total_tokens} tokens`;
  drawSpeculative(data, at);
}

// shown only on a server that drafts (data.speculative is null otherwise)
function drawSpeculative(data, at) {
  const spec = data.speculative;
  const shown = spec !== null && spec !== undefined;
  for (const el of document.querySelectorAll(".spec")) {
    if (el.hidden === shown) {
      el.hidden = !shown;
      if (shown) charts.accept.resize(); // drawn at zero size while hidden
    }
  }
  if (!shown) return;
  document.getElementById("accept-length").textContent = spec.accept_length.toFixed(2);
  document.getElementById("spec-drafts").textContent = spec.num_drafts;
  document.getElementById("spec-accepted").textContent =
    `${spec.num_accepted_tokens}/${spec.num_draft_tokens}`;
  charts.accept.setOption(lineOption([["accept length", at("accept_length")]]));
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const sep = window.RADIXSERVE_QUERY ? "&" : "?";
    const url = "/cache_tree" + window.RADIXSERVE_QUERY + sep + "max_nodes=" + MAX_NODES;
    const resp = await fetch(url);
    if (!resp.ok) throw new Error(`${resp.status} ${(await resp.text()).slice(0, 200)}`);
    const data = await resp.json();
    drawTree(data.tree);
    drawStats(data);
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.className = "";
    document.body.dataset.ready = "1";
  } catch (err) {
    status.textContent = "error: " + err.message;
    status.className = "error";
  }
  setTimeout(poll, POLL_MS);
}

poll();

"""The review page's HTML, CSS and script (page.py fills in the data and the title)."""

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'">
<title>quantgate review: <!--TITLE--></title>
<style>
body { font: 15px/1.45 system-ui, "Noto Sans", "Noto Sans CJK SC", "PingFang SC", "Microsoft YaHei", sans-serif; margin: 0; color: #1b1f24; background: #f6f7f9; }
header { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #d0d7de; padding: 8px 16px; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; z-index: 1; }
header h1 { font-size: 16px; margin: 0; }
#progress { flex: 1; min-width: 160px; }
#bar { height: 6px; background: #d0d7de; border-radius: 3px; overflow: hidden; }
#bar div { height: 100%; background: #1f883d; width: 0; }
main { max-width: 1100px; margin: 16px auto; padding: 0 16px; }
.meta { color: #57606a; font-size: 13px; }
.box { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 12px; margin: 8px 0; white-space: pre-wrap; word-break: break-word; }
.label { font-weight: 600; font-size: 13px; color: #57606a; margin-top: 12px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.side h2 { font-size: 15px; margin: 12px 0 0; }
.choices { display: flex; gap: 8px; flex-wrap: wrap; margin: 6px 0; }
button { font: inherit; padding: 5px 10px; border: 1px solid #d0d7de; border-radius: 6px; background: #fff; cursor: pointer; }
button.on { background: #0969da; color: #fff; border-color: #0969da; }
button.bad.on { background: #cf222e; border-color: #cf222e; }
textarea { width: 100%; box-sizing: border-box; font: inherit; min-height: 48px; }
kbd { font: 12px ui-monospace, monospace; border: 1px solid #d0d7de; border-bottom-width: 2px; border-radius: 4px; padding: 0 4px; background: #f6f8fa; }
#help { font-size: 13px; color: #57606a; }
#status { font-size: 13px; }
#namebox { position: fixed; inset: 0; background: rgba(0,0,0,.35); display: none; align-items: center; justify-content: center; z-index: 2; }
#namebox div { background: #fff; padding: 20px; border-radius: 8px; max-width: 420px; }
.done { color: #1f883d; font-weight: 600; }
</style>
</head>
<body>
<header>
  <h1>quantgate review</h1>
  <span class="meta" id="who"></span>
  <div id="progress"><div id="count" class="meta"></div><div id="bar"><div></div></div></div>
  <button id="prev" title="previous (k)">&larr; prev</button>
  <button id="next" title="next (j)">next &rarr;</button>
  <button id="save" title="save (s)">Save judgments</button>
  <span id="status" role="status"></span>
</header>
<main>
  <p id="help">Two outputs, A and B, one from the baseline and one from a quantized format, in an order drawn per item: you are not told which is which.
  Keys: <kbd>1</kbd> A better, <kbd>2</kbd> same, <kbd>3</kbd> B better; A acceptable <kbd>q</kbd> yes / <kbd>w</kbd> no; B acceptable <kbd>o</kbd> yes / <kbd>p</kbd> no;
  <kbd>c</kbd> comment (<kbd>Esc</kbd> leaves it); <kbd>j</kbd>/<kbd>&rarr;</kbd> next, <kbd>k</kbd>/<kbd>&larr;</kbd> previous; <kbd>s</kbd> save. Progress is kept in this browser.</p>
  <div class="meta" id="where"></div>
  <div id="input"></div>
  <div class="label">Reference</div><div class="box" id="reference"></div>
  <div class="pair">
    <div class="side"><h2>A</h2><div class="box" id="out-a"></div>
      <div class="label">Acceptable for the business?</div>
      <div class="choices"><button data-acc="a" data-val="true">yes (q)</button><button class="bad" data-acc="a" data-val="false">no (w)</button></div></div>
    <div class="side"><h2>B</h2><div class="box" id="out-b"></div>
      <div class="label">Acceptable for the business?</div>
      <div class="choices"><button data-acc="b" data-val="true">yes (o)</button><button class="bad" data-acc="b" data-val="false">no (p)</button></div></div>
  </div>
  <div class="label">Which is better?</div>
  <div class="choices"><button data-pref="A">A better (1)</button><button data-pref="same">same (2)</button><button data-pref="B">B better (3)</button></div>
  <div class="label">Comment (optional)</div>
  <textarea id="comment" placeholder="why, if it matters"></textarea>
</main>
<div id="namebox"><div><p>Your name, as it will stand on your judgments (letters, digits, - and _):</p>
  <input id="name" autocomplete="name"> <button id="name-ok">OK</button><p class="meta" id="name-err"></p></div></div>
<script id="review-data" type="application/json">/*DATA*/null</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("review-data").textContent);
const STORE = "quantgate-review:" + DATA.plan;
const $ = (id) => document.getElementById(id);
let state = load();
let at = Math.max(0, Math.min(DATA.items.length - 1, state.at || 0));

function load() {
  try { return JSON.parse(localStorage.getItem(STORE)) || { judged: {} }; } catch (e) { return { judged: {} }; }
}
function keep() {
  state.at = at;
  try { localStorage.setItem(STORE, JSON.stringify(state)); } catch (e) { /* a file: URL without storage still works */ }
}
function judgment(item) { return state.judged[item.key] || (state.judged[item.key] = {}); }
function complete(j) { return j.preference && typeof j.a === "boolean" && typeof j.b === "boolean"; }
function text(el, value) { el.textContent = value; }
function field(label, value, lang) {
  const head = document.createElement("div"); head.className = "label"; text(head, label);
  const box = document.createElement("div"); box.className = "box"; box.lang = lang; text(box, value);
  return [head, box];
}
function show() {
  const item = DATA.items[at];
  const j = judgment(item);
  const lang = DATA.languages[item.evalset] || "en";
  text($("where"), `item ${at + 1} of ${DATA.items.length} · format ${item.format} · ${item.evalset} / ${item.id}` +
       (item.stratum === "worst" ? " · from the worst items (shown, not counted in the rates)" : ""));
  const input = $("input"); input.replaceChildren();
  const parts = item.input.prompt !== undefined ? [["Prompt", item.input.prompt]] :
    [["Instruction", item.input.instruction], ["Question", item.input.question], ["Context", item.input.context]];
  for (const [label, value] of parts) if (value) input.append(...field(label, value, lang));
  for (const id of ["reference", "out-a", "out-b"]) $(id).lang = lang;
  text($("reference"), item.reference || "(none)");
  text($("out-a"), item.a || "(empty)");
  text($("out-b"), item.b || "(empty)");
  for (const el of document.querySelectorAll("[data-pref]")) el.classList.toggle("on", j.preference === el.dataset.pref);
  for (const el of document.querySelectorAll("[data-acc]")) el.classList.toggle("on", j[el.dataset.acc] === (el.dataset.val === "true"));
  $("comment").value = j.comment || "";
  const done = DATA.items.filter((i) => complete(judgment(i))).length;
  text($("count"), `${done} of ${DATA.items.length} judged` + (complete(j) ? " · this one done" : ""));
  $("bar").firstElementChild.style.width = (100 * done / DATA.items.length) + "%";
  text($("who"), state.name ? "reviewer: " + state.name : "");
  keep();
}
function set(key, value) { const j = judgment(DATA.items[at]); j[key] = value; j.at = new Date().toISOString(); show(); }
function move(step) { at = Math.max(0, Math.min(DATA.items.length - 1, at + step)); show(); }
function lines() {
  const out = [];
  for (const item of DATA.items) {
    const j = judgment(item);
    if (!complete(j)) continue;
    out.push(JSON.stringify({ schema: DATA.schema, run: DATA.run, plan: DATA.plan, item: item.key, reviewer: state.name,
      preference: j.preference, acceptable_a: j.a, acceptable_b: j.b, comment: j.comment || "",
      hash_a: item.hash_a, hash_b: item.hash_b, judged_at: j.at || new Date().toISOString() }));
  }
  return out;
}
async function save() {
  if (!state.name) { askName(); return; }
  const body = lines();
  if (!body.length) { text($("status"), "nothing judged yet: judge at least one item completely (better, and both acceptable)"); return; }
  const name = "review-" + state.name + ".jsonl";
  if (DATA.serve) {
    try {
      const reply = await fetch("/judgments?reviewer=" + encodeURIComponent(state.name), { method: "POST", body: body.join("\n") + "\n" });
      text($("status"), reply.ok ? `saved ${body.length} judgment(s) to ${await reply.text()}` : "not saved: " + await reply.text());
    } catch (e) { text($("status"), "not saved: the review server did not answer (" + e + ")"); }
    return;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([body.join("\n") + "\n"], { type: "application/x-ndjson" }));
  link.download = name;
  document.body.append(link); link.click(); link.remove();
  text($("status"), `saved ${body.length} judgment(s) as ${name}: put it beside the run and run quantgate report RUN_DIR --reviews ${name}`);
}
function askName() { $("namebox").style.display = "flex"; $("name").value = state.name || ""; $("name").focus(); }
function takeName() {
  const name = $("name").value.trim();
  if (!/^[A-Za-z0-9_-]{1,40}$/.test(name)) { text($("name-err"), "letters, digits, - and _ only (it names the file)"); return; }
  state.name = name; $("name").blur(); $("namebox").style.display = "none"; show();
}
$("name-ok").onclick = takeName;
$("name").addEventListener("keydown", (e) => {
  if ($("namebox").style.display !== "flex") return;  // hidden: the key is a judgment, for the document's handler
  if (e.key === "Enter") { e.preventDefault(); takeName(); }
  e.stopPropagation();
});
$("prev").onclick = () => move(-1);
$("next").onclick = () => move(1);
$("save").onclick = save;
for (const el of document.querySelectorAll("[data-pref]")) el.onclick = () => set("preference", el.dataset.pref);
for (const el of document.querySelectorAll("[data-acc]")) el.onclick = () => set(el.dataset.acc, el.dataset.val === "true");
$("comment").addEventListener("input", () => { judgment(DATA.items[at]).comment = $("comment").value; keep(); });
document.addEventListener("keydown", (e) => {
  if (e.target === $("comment")) { if (e.key === "Escape") $("comment").blur(); return; }
  if (e.ctrlKey || e.metaKey || e.altKey || $("namebox").style.display === "flex") return;
  const keys = { "1": () => set("preference", "A"), "2": () => set("preference", "same"), "3": () => set("preference", "B"),
    q: () => set("a", true), w: () => set("a", false), o: () => set("b", true), p: () => set("b", false),
    j: () => move(1), ArrowRight: () => move(1), k: () => move(-1), ArrowLeft: () => move(-1),
    c: () => $("comment").focus(), s: () => save() };
  if (keys[e.key]) { e.preventDefault(); keys[e.key](); }
});
show();
if (!state.name) askName();
</script>
</body>
</html>
"""

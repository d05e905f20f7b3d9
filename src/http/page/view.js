// lockd's web view: renders the `state` and `lock` messages of /events. Everything shown is
// set as text (never as HTML): names, ids and notes are whatever clients sent.
"use strict";

const MAX_EVENTS = 200;
const board = document.getElementById("board");
const empty = document.getElementById("empty");
const events = document.getElementById("events");
const link = document.getElementById("link");
const summary = document.getElementById("summary");
const prefixInput = document.getElementById("prefix");

let source = null;
let retry = null;
// Times on the board count on from when its state arrived (this browser's clock need not
// agree with the server's).
let clocks = [];
let arrived = performance.now();

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data")) e.setAttribute(k.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase()), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c === null || c === undefined ? "" : c);
  return e;
}

function duration(ms) {
  if (ms < 1000) return Math.max(0, Math.floor(ms)) + "ms";
  let s = Math.floor(ms / 1000);
  if (s < 60) return (ms / 1000).toFixed(1) + "s";
  const d = Math.floor(s / 86400); s %= 86400;
  const h = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  if (d) return d + "d " + h + "h";
  if (h) return h + "h " + m + "m";
  return m + "m " + s + "s";
}

// A cell whose duration counts up (held, waited) or down (ttl left) with the page's clock.
function clock(ms, sign) {
  const td = el("td", { class: "time" });
  clocks.push({ td, ms, sign });
  return td;
}

function tick() {
  const since = performance.now() - arrived;
  for (const c of clocks) c.td.textContent = duration(Math.max(0, c.ms + c.sign * since));
}

function setLink(kind, text) {
  link.className = "link " + kind;
  link.textContent = text;
  link.dataset.state = kind;
}

function renderLock(lock) {
  const holders = el("tbody");
  for (const h of lock.holders) {
    holders.append(el("tr", { class: "holder" + (h.lingering ? " lingering" : ""), dataHolder: h.id },
      el("td", { class: "id" }, h.id),
      el("td", {}, h.user || ""),
      el("td", { class: "note" }, h.note || ""),
      el("td", { class: "token" }, String(h.token)),
      clock(h.held_ms, 1),
      clock(h.left_ms, -1),
      el("td", {}, (h.session ? "session" : "plain") + (h.lingering ? ", over" : "")),
    ));
  }
  const queue = el("tbody");
  lock.queue.forEach((w, i) => {
    queue.append(el("tr", { class: "waiter", dataWaiter: w.id },
      el("td", {}, String(i + 1)),
      el("td", { class: "id" }, w.id),
      clock(w.waited_ms, 1),
      el("td", {}, (w.session ? "session" : "plain") + (w.mode === "exclusive" ? "" : ", " + w.mode)),
      el("td", { class: "set" }, w.set.length ? "with " + w.set.filter((n) => n !== lock.name).join(", ") : ""),
    ));
  });
  const section = el("section", { class: "lock", dataLock: lock.name },
    el("h3", {}, lock.name, el("span", { class: "mode" }, lock.mode)),
    el("table", { class: "holders" },
      el("thead", {}, el("tr", {}, ...["holder", "user", "note", "token", "held for", "ttl left", ""].map((t) => el("th", {}, t)))),
      holders));
  if (lock.waiting > 0) {
    section.append(el("table", { class: "queue" },
      el("thead", {}, el("tr", {}, ...["#", "waiting", "waited", "", ""].map((t) => el("th", {}, t)))),
      queue));
    if (lock.waiting > lock.queue.length) {
      section.append(el("p", { class: "more" }, (lock.waiting - lock.queue.length) + " more waiting"));
    }
  }
  return section;
}

function renderState(state) {
  clocks = [];
  arrived = performance.now();
  for (const old of board.querySelectorAll(".lock, .more-locks")) old.remove();
  for (const lock of state.locks) board.append(renderLock(lock));
  if (state.more > 0) board.append(el("p", { class: "more more-locks" }, state.more + " more locks held (--web-locks)"));
  empty.hidden = state.locks.length > 0;
  const waiting = state.locks.reduce((n, l) => n + l.waiting, 0);
  summary.textContent = (state.locks.length + state.more) + " held, " + waiting + " waiting" +
    (state.etcd ? ", etcd view " + duration(state.etcd.age_ms) + " old" : "");
  tick();
  setLink("live", "live");
}

function addEvent(e) {
  const at = new Date(e.at_unix_ms);
  const item = el("li", { class: e.kind, dataEvent: e.kind },
    el("time", { datetime: at.toISOString() }, at.toLocaleTimeString()),
    el("span", { class: "kind" }, e.kind), " ",
    el("code", {}, e.name), " by ", el("code", {}, e.id), " token " + e.token,
    e.kind === "acquired"
      ? (e.waited_ms !== null ? " after waiting " + duration(e.waited_ms) : "")
      : " after " + duration(e.held_ms),
    e.by ? " (broken by " + e.by + ")" : "",
    e.note ? el("div", { class: "quiet" }, e.note) : "");
  events.prepend(item);
  while (events.children.length > MAX_EVENTS) events.lastElementChild.remove();
}

function connect() {
  clearTimeout(retry);
  if (source) source.close();
  const prefix = prefixInput.value.trim();
  const url = "events" + (prefix ? "?prefix=" + encodeURIComponent(prefix) : "");
  source = new EventSource(url);
  // Until the first board of this connection, what is shown may be old.
  source.onopen = () => {
    events.replaceChildren();
    setLink("catching-up", "catching up…");
  };
  source.onerror = () => {
    setLink("lost", "lost the server; reconnecting…");
    // A refusal (not an HTTP 200 stream) closes the source for good: try again ourselves.
    if (source.readyState === EventSource.CLOSED) retry = setTimeout(connect, 2000);
  };
  source.addEventListener("state", (m) => renderState(JSON.parse(m.data)));
  source.addEventListener("lock", (m) => addEvent(JSON.parse(m.data)));
  source.addEventListener("lagged", (m) => {
    const missed = JSON.parse(m.data).missed;
    events.prepend(el("li", { class: "quiet" }, "missed " + missed + " events (the board is current)"));
  });
  source.addEventListener("unavailable", (m) => setLink("lost", "the server can't see its locks: " + JSON.parse(m.data).why));
}

prefixInput.value = new URLSearchParams(location.search).get("prefix") || "";
document.getElementById("filter").addEventListener("submit", (e) => {
  e.preventDefault();
  const prefix = prefixInput.value.trim();
  history.replaceState(null, "", prefix ? "?prefix=" + encodeURIComponent(prefix) : location.pathname);
  connect();
});
setInterval(tick, 250);
connect();

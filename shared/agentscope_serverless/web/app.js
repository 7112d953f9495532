// The chat page: sign in with an API key, list and open sessions, stream replies from
// /process (Server-Sent Events over fetch), stop a run, show tool calls and memories used.
// Everything it fetches is on its own server; untrusted text is only ever set as textContent
// (the agent's markdown is built as DOM nodes, see markdown.js).

import { markdown } from "./markdown.js";

const KEY_STORAGE = "agentscope-serverless.api-key";
const RUN_STORAGE = "agentscope-serverless.run"; // the run being streamed: {id, session, text}
const MEMORY_TOP_K = 5;
const PAGE_SIZE = 1000; // the most the sessions routes give at once
const MAX_SHOWN = 2000; // the newest messages a session shows (the page stays responsive)
const LONG_RESULT = 2000; // the characters of a tool's result shown open; a longer one is folded
const RESUME_ATTEMPTS = 5; // tries to pick a broken stream up again, waiting 0.5 s, 1 s, 2 s...
// A sessions list the server could not give (unreachable, or failing) is asked for again after
// 2 s, then at doubling intervals up to a minute, and at once when the browser is back online.
const SESSIONS_RETRY_MS = 2000;
const SESSIONS_RETRY_MAX_MS = 60000;
// A session is listed by its title: the start of its first message of the user, read with its
// first messages when its button comes into view, a few sessions at a time.
const TITLE_CHARS = 80;
const TITLE_MESSAGES = 20;
const TITLE_READS = 4;
const TERMINAL = new Set(["completed", "failed", "canceled", "rejected", "incomplete"]);
// Text that shows nothing: whitespace and format characters (zero width spaces and joiners,
// soft hyphens...), as the server reads a blank message (what Python counts as whitespace).
const BLANK = /^[\s\p{Cf}\x1c-\x1f\x85]*$/u;
// A key of the right form that the server does not know: most often a development key of a
// server since restarted (it printed a new one).
const KEY_FORM = /^ask_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$/;
const RESTARTED = "A development key lasts as long as the server that printed it: after a restart, use the new one.";

const $ = (id) => document.getElementById(id);

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  session: null,
  run: null, // {controller, id, stopped}
  loading: null, // AbortController of the session being loaded
  listing: null, // AbortController of the sessions list being loaded
  sessionsRetry: { timer: 0, delay: SESSIONS_RETRY_MS },
  toolNames: new Map(), // call_id -> tool name, to title results
  runTexts: new Map(), // run id -> the message that started it, of the runs this tab sent
  titles: new Map(), // session id -> its title, once read
  titling: null, // {observer, queue, reading} of the sessions listed
};

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// --- HTTP -----------------------------------------------------------------------------

async function api(path, { method = "GET", json, signal, accept } = {}) {
  const headers = { Authorization: `Bearer ${state.key}` };
  if (json !== undefined) headers["Content-Type"] = "application/json";
  if (accept) headers.Accept = accept;
  const response = await fetch(path, {
    method,
    headers,
    body: json === undefined ? undefined : JSON.stringify(json),
    signal,
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) {
    signOut(`Your key was not accepted. ${RESTARTED} Sign in again.`);
    throw new ApiError(401, "not signed in");
  }
  if (!response.ok) throw new ApiError(response.status, await errorText(response));
  return response;
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error) return `${body.error.message} (${body.error.code})`;
  } catch (_) {
    // not JSON: the status says enough
  }
  return `HTTP ${response.status}`;
}

// Every item, a page at a time: lists come oldest first, so stopping early would hide the newest.
async function* pages(path, limit, signal) {
  const seen = new Set();
  let cursor = null;
  do {
    const query = new URLSearchParams({ limit: String(limit) });
    if (cursor) query.set("cursor", cursor);
    const body = await (await api(`${path}?${query}`, { signal })).json();
    yield* body.items || [];
    seen.add(cursor);
    cursor = body.next_cursor;
  } while (cursor && !seen.has(cursor));
}

// Server-Sent Events from a fetch body: yields each event's parsed `data` JSON. Each piece of
// the body is searched once, and an event's pieces are joined once, at its end: an event sent
// in many pieces (a long reply's last ones hold it whole) takes a time in proportion to it.
async function* serverSentEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pieces = []; // the event being received
  let tail = ""; // its last characters, where the blank line ending it may begin
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const text = tail + value;
    let start = 0;
    for (const end of text.matchAll(/\r?\n\r?\n/g)) {
      pieces.push(text.slice(start, end.index));
      const data = pieces
        .join("")
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      pieces = [];
      start = end.index + end[0].length;
      if (data) yield JSON.parse(data);
    }
    pieces.push(text.slice(start, -3));
    tail = text.slice(Math.max(start, text.length - 3));
  }
}

// --- Sign in and out ------------------------------------------------------------------

function showChat() {
  $("sign-in").hidden = true;
  $("chat").hidden = false;
  const keyId = (state.key.split("_")[1] || "").slice(0, 12);
  $("whoami").textContent = keyId ? `Signed in with key ${keyId}` : "Signed in";
  newChat();
  loadSessions();
  resumeRun();
}

function signOut(message = "") {
  stopRun();
  stopLoading();
  stopListing();
  clearTimeout(state.sessionsRetry.timer);
  state.sessionsRetry = { timer: 0, delay: SESSIONS_RETRY_MS };
  sessionStorage.removeItem(KEY_STORAGE);
  sessionStorage.removeItem(RUN_STORAGE);
  state.key = null;
  state.session = null;
  stopReadingTitles();
  state.titles.clear();
  state.runTexts.clear();
  // Nothing of theirs is left for whoever signs in next in this tab.
  $("composer-input").value = "";
  fitComposer();
  $("sessions").replaceChildren();
  $("messages").replaceChildren();
  $("chat").hidden = true;
  $("sign-in").hidden = false;
  $("api-key").value = "";
  $("sign-in-error").textContent = message;
  $("api-key").focus();
}

async function signIn(event) {
  event.preventDefault();
  // Copied from a document, a key may come with invisible characters or quotes around it.
  const key = $("api-key")
    .value.replace(/[\s\u200b-\u200d\u2060\ufeff]/g, "")
    .replace(/^["'\u2018\u2019\u201c\u201d]+|["'\u2018\u2019\u201c\u201d]+$/g, "");
  const error = $("sign-in-error");
  if (!key) {
    error.textContent = "Enter your API key.";
    return;
  }
  if (!/^[\x21-\x7e]+$/.test(key)) {
    error.textContent = "That key was not accepted: it holds characters no key has.";
    return;
  }
  error.textContent = "";
  try {
    const response = await fetch("sessions?limit=1", {
      headers: { Authorization: `Bearer ${key}` },
      cache: "no-store",
      credentials: "omit",
    });
    // 404: a server without the sessions routes (the process function alone) still chats.
    if (response.status === 401 || response.status === 403) {
      error.textContent = "That key was not accepted.";
      if (response.status === 401 && KEY_FORM.test(key)) error.textContent += ` ${RESTARTED}`;
      return;
    }
    if (!response.ok && response.status !== 404) {
      error.textContent = `The server answered ${await errorText(response)}.`;
      return;
    }
  } catch (_) {
    error.textContent = "Cannot reach the server.";
    return;
  }
  state.key = key;
  sessionStorage.setItem(KEY_STORAGE, key);
  showChat();
  $("composer-input").focus();
}

// --- Sessions -------------------------------------------------------------------------

async function loadSessions() {
  const list = $("sessions");
  const status = $("sessions-status");
  const retry = state.sessionsRetry;
  clearTimeout(retry.timer);
  retry.timer = 0;
  stopListing();
  const listing = (state.listing = new AbortController());
  status.textContent = "Loading…";
  const ids = [];
  try {
    for await (const session of pages("sessions", PAGE_SIZE, listing.signal)) ids.push(session.id);
  } catch (error) {
    if (listing.signal.aborted) return;
    if (error.status === 404) status.textContent = "Not available on this server.";
    else if (error.status === 401) status.textContent = "";
    else status.textContent = error.status ? error.message : "Cannot reach the server.";
    if (state.key && (!error.status || error.status === 429 || error.status >= 500)) {
      status.textContent += " Trying again…";
      retry.timer = setTimeout(loadSessions, retry.delay);
      retry.delay = Math.min(retry.delay * 2, SESSIONS_RETRY_MAX_MS);
    }
    return;
  }
  if (listing.signal.aborted) return;
  state.listing = null;
  retry.delay = SESSIONS_RETRY_MS;
  list.replaceChildren(
    ...ids.reverse().map((id) => {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.session = id;
      labelSession(button);
      if (id === state.session) button.setAttribute("aria-current", "true");
      button.addEventListener("click", () => openSession(id));
      item.append(button);
      return item;
    }),
  );
  status.textContent = ids.length ? "" : "No sessions yet.";
  readTitles(list);
}

// A session's button says its title once read (its id until then, or when it has none).
function labelSession(button) {
  const id = button.dataset.session;
  const title = state.titles.get(id);
  button.textContent = title || id;
  button.classList.toggle("titled", Boolean(title));
  button.title = title ? `${title}\n${id}` : id;
  button.setAttribute("aria-label", `Open session ${title || id}`);
}

// Read the titles of the sessions of `list` whose buttons come into view.
function readTitles(list) {
  stopReadingTitles();
  const titling = { queue: [], reading: 0 };
  titling.observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      titling.observer.unobserve(entry.target);
      titling.queue.push(entry.target.dataset.session);
    }
    readNextTitles(titling);
  });
  for (const button of list.querySelectorAll("button")) {
    if (!state.titles.has(button.dataset.session)) titling.observer.observe(button);
  }
  state.titling = titling;
}

function stopReadingTitles() {
  state.titling?.observer.disconnect();
  state.titling = null;
}

function readNextTitles(titling) {
  while (titling.reading < TITLE_READS && titling.queue.length && state.titling === titling) {
    const id = titling.queue.shift();
    titling.reading += 1;
    readTitle(titling, id).finally(() => {
      titling.reading -= 1;
      readNextTitles(titling);
    });
  }
}

async function readTitle(titling, id) {
  let messages;
  try {
    const path = `sessions/${encodeURIComponent(id)}/messages?limit=${TITLE_MESSAGES}`;
    messages = (await (await api(path)).json()).items || [];
  } catch (_) {
    return; // deleted meanwhile, or the server out of reach: its id stays its label
  }
  const title = titleOf(messages);
  if (!title || state.titling !== titling) return; // signed out, or listed again meanwhile
  state.titles.set(id, title);
  const button = $("sessions").querySelector(`button[data-session="${CSS.escape(id)}"]`);
  if (button) labelSession(button);
}

// The start of the first text the user wrote, on one line.
function titleOf(messages) {
  for (const message of messages) {
    if (message.role !== "user") continue;
    const text = (message.content || [])
      .filter((part) => part.type === "text" && typeof part.text === "string")
      .map((part) => part.text)
      .join(" ")
      .replace(/\s+/g, " ")
      .trim();
    if (BLANK.test(text)) continue; // nothing a user sees: no title
    if (text.length <= TITLE_CHARS) return text;
    // Cut between two characters, not in the middle of one of two UTF-16 units (an emoji).
    return `${text.slice(0, TITLE_CHARS - 1).replace(/[\ud800-\udbff]$/, "")}…`;
  }
  return null;
}

function markCurrentSession() {
  for (const button of $("sessions").querySelectorAll("button")) {
    if (button.dataset.session === state.session) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
  }
  $("session-label").textContent = state.session ? `Session ${state.session}` : "New session";
}

// Stop loading a list of sessions of one who signed out, so it does not land in the next one's.
function stopListing() {
  state.listing?.abort();
  state.listing = null;
}

// Stop loading a session the user has left, so its messages do not land in the next one.
function stopLoading() {
  state.loading?.abort();
  state.loading = null;
}

function newChat() {
  leaveRun();
  stopLoading();
  state.session = null;
  state.toolNames.clear();
  $("messages").replaceChildren(emptyState());
  $("run-status").textContent = "";
  markCurrentSession();
}

function emptyState() {
  const item = document.createElement("li");
  item.className = "empty";
  const title = document.createElement("strong");
  title.textContent = "Start a conversation";
  item.append(title, "Your messages and the agent's replies are kept in a session you can reopen later.");
  return item;
}

function hiddenNote(count) {
  const item = document.createElement("li");
  item.className = "hidden-note";
  item.textContent = `${count} earlier ${count === 1 ? "message is" : "messages are"} not shown.`;
  return item;
}

async function openSession(id) {
  leaveRun();
  stopLoading();
  const loading = new AbortController();
  // Settled once the session is on screen (``finished``), or left: a message sent meanwhile
  // waits for it.
  let settle;
  loading.done = new Promise((resolve) => {
    settle = resolve;
  });
  loading.signal.addEventListener("abort", () => settle());
  state.loading = loading;
  state.session = id;
  state.toolNames.clear();
  markCurrentSession();
  const log = $("messages");
  log.replaceChildren();
  $("run-status").textContent = "Loading the session…";
  const lastRun = lastRunOf(id, loading.signal);
  let going = null; // the session's run still going on
  try {
    const path = `sessions/${encodeURIComponent(id)}/messages`;
    // The newest messages alone are built, once all are read: the older ones, built to be
    // taken away, took seconds of a long session's opening (20,000 messages, 8 s).
    let newest = [];
    let hidden = 0;
    const keepNewest = () => {
      const older = newest.slice(0, -MAX_SHOWN);
      for (const message of older) noteToolNames(message);
      hidden += older.length;
      newest = newest.slice(-MAX_SHOWN);
    };
    for await (const message of pages(path, PAGE_SIZE, loading.signal)) {
      if (loading.signal.aborted) return;
      newest.push(message);
      if (newest.length >= 2 * MAX_SHOWN) keepNewest();
    }
    keepNewest();
    if (hidden) log.append(hiddenNote(hidden));
    for (const message of newest) {
      const view = messageView(message);
      renderParts(view, message.content || []);
      log.append(view.item);
    }
    const run = await lastRun;
    if (loading.signal.aborted) return;
    if (run && !TERMINAL.has(run.status)) going = run;
    // A run that ended without a reply (failed, stopped) says so, as it did while it streamed.
    $("run-status").textContent = run && !going ? showRunEnd(run.status, run.error) : "";
  } catch (error) {
    if (loading.signal.aborted) return;
    $("run-status").textContent = `Could not load the session: ${error.message}`;
  }
  state.loading = null;
  loading.finished = true;
  settle();
  if (!log.children.length) log.append(emptyState());
  scrollToEnd(true);
  $("composer-input").focus();
  if (going) followRun(going.id, state.runTexts.get(going.id));
}

// The last run of a session (null when it has none, or the server keeps no runs). Background
// and A2A tasks have no events to follow: not counted.
async function lastRunOf(id, signal) {
  try {
    const response = await api(`runs?session_id=${encodeURIComponent(id)}`, { signal });
    const runs = (await response.json()).items || [];
    return runs.filter((run) => run.kind !== "task" && run.kind !== "a2a_task").at(-1) ?? null;
  } catch (_) {
    return null;
  }
}

// --- Rendering --------------------------------------------------------------------------

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// An agent's tool calls and their results: its own functions', plugins' (AgentScope's
// agents), MCP servers'.
const CALLS = new Set(["function_call", "plugin_call", "mcp_call"]);
const RESULTS = new Set(["function_call_output", "plugin_call_output", "mcp_call_output"]);

function kindOf(message) {
  if (CALLS.has(message.type) || RESULTS.has(message.type)) return "tool";
  return message.role === "user" ? "user" : "assistant";
}

function whoLabel(message) {
  if (CALLS.has(message.type)) return "Tool call";
  if (RESULTS.has(message.type)) return "Tool result";
  if (message.type === "reasoning") return "Reasoning";
  return { user: "You", system: "System", tool: "Tool" }[message.role] || "Agent";
}

// A message's list item: {item, body, parts: [node per content index], message}.
function messageView(message) {
  const item = element("li", `message ${kindOf(message)}`);
  item.dataset.id = message.id || "";
  const who = element("span", "who", whoLabel(message));
  const body = element("div", "body");
  body.dir = "auto"; // a message written right to left reads so
  if (message.type === "reasoning") {
    // A thinking model's reasoning: shown while it streams, folded away once done.
    item.classList.add("reasoning");
    const details = element("details");
    details.append(element("summary", "", "Show the reasoning"), body);
    item.append(who, details);
  } else {
    item.append(who, body);
  }
  return { item, body, parts: [], message };
}

function renderParts(view, contents) {
  view.body.replaceChildren();
  view.parts = [];
  contents.forEach((content, index) => setPart(view, index, content));
}

function setPart(view, index, content) {
  const node = partNode(view.message, content);
  const old = view.parts[index];
  if (old) old.replaceWith(node);
  else view.body.append(node);
  view.parts[index] = node;
}

function partNode(message, content) {
  if (content.type === "text" && isReply(message)) return replyText(content.text || "");
  if (content.type === "text") return element("span", "text", content.text || "");
  if (content.type === "refusal") return element("span", "text refusal", content.refusal || "");
  if (content.type === "image") return imageNode(content.image_url);
  if (content.type === "data" && CALLS.has(message.type)) return callNode(content.data || {});
  if (content.type === "data" && RESULTS.has(message.type)) return resultNode(content.data || {});
  if (content.type === "data") {
    return element("pre", "", pretty(content.data) ?? "(data nested too deeply to show)");
  }
  if (content.type === "file") return element("span", "text", `[file ${content.filename || content.file_id || ""}]`);
  return element("span", "text", `[${content.type} content]`);
}

// The agent's own words (not a tool's, not the user's): shown as markdown.
function isReply(message) {
  return message.role === "assistant" && (message.type || "message") === "message";
}

// The markdown of a reply's text part; its source is kept for the pieces to come.
function replyText(text) {
  const node = element("div", "text markdown");
  streamedText.set(node, text);
  node.append(markdown(text));
  return node;
}

// A piece of a streamed text (a reply's, reasoning, a refusal, a tool's): the part is shown
// again at a coming frame, once whatever the number of pieces, and at most a fifth of the time
// (a long reply's markdown takes longer to build). Set piece by piece, a text of many pieces
// took a time in the square of its length.
const streamedText = new WeakMap(); // a part -> its text so far
const pendingText = new Set();
let showCost = 0;
function appendStreamedText(node, text) {
  streamedText.set(node, (streamedText.get(node) ?? node.textContent) + text);
  if (pendingText.size === 0) {
    setTimeout(() => requestAnimationFrame(showPendingText), showCost * 4);
  }
  pendingText.add(node);
}

function showPendingText() {
  const start = performance.now();
  for (const node of pendingText) {
    const text = streamedText.get(node);
    if (node.classList.contains("markdown")) rebuild(node, markdown(text));
    else node.textContent = text;
  }
  pendingText.clear();
  showCost = performance.now() - start;
  showFrame(); // the text grew, in this frame
}

// ``node``'s content replaced with ``content`` while out of the page: in a message, whose
// direction the browser works out from its text (see messageView), each block put in worked it
// out again, and a reply of thousands of lines froze the page for seconds at every piece.
function rebuild(node, content) {
  const spot = new Comment();
  node.replaceWith(spot);
  node.replaceChildren(content);
  spot.replaceWith(node);
}

function imageNode(url, alt = "Image from the agent") {
  // The page's Content-Security-Policy allows images from this server and data: URIs only.
  if (typeof url === "string" && (url.startsWith("data:image/") || sameOrigin(url))) {
    const image = element("img");
    image.src = url;
    image.alt = alt;
    return image;
  }
  return element("span", "text", `[image: ${url || "no URL"}]`);
}

// A path on this server; not "//host/..." nor "/\host/...", which browsers read as another host.
function sameOrigin(url) {
  if (!url.startsWith("/")) return false;
  try {
    return new URL(url, document.baseURI).origin === window.location.origin;
  } catch (_) {
    return false;
  }
}

// A JSON value (or JSON text) indented; text that is not JSON as it is; null for a value
// nested too deeply to write (a tool's output is anything: thousands of "[" overflow the stack).
function pretty(value) {
  try {
    return JSON.stringify(typeof value === "string" ? JSON.parse(value) : value, null, 2);
  } catch (_) {
    return typeof value === "string" ? value : null;
  }
}

// The names of the tool calls of a message not shown, for their results shown to say.
function noteToolNames(message) {
  if (!CALLS.has(message.type)) return;
  for (const content of message.content || []) {
    const call = (content.type === "data" && content.data) || {};
    if (call.call_id && call.name) state.toolNames.set(call.call_id, call.name);
  }
}

function callNode(call) {
  if (call.call_id && call.name) state.toolNames.set(call.call_id, call.name);
  const details = element("details");
  const summary = element("summary");
  summary.append("Calls ", element("code", "", call.name || "a tool"));
  details.append(summary, element("pre", "", pretty(call.arguments || "")));
  return details;
}

// The nodes showing the parts of an MCP CallToolResult's content; null when a part is nested
// too deeply to write.
function contentNodes(parts, name) {
  const nodes = [];
  for (const part of parts) {
    if (part && part.type === "text") nodes.push(element("pre", "", part.text || ""));
    else if (part && part.type === "image" && typeof part.data === "string") {
      const mime = /^image\/[a-z0-9.+-]+$/i.test(part.mimeType || "") ? part.mimeType : "image/png";
      nodes.push(imageNode(`data:${mime};base64,${part.data}`, `Image from ${name || "the tool"}`));
    } else {
      const text = pretty(part);
      if (text === null) return null;
      nodes.push(element("pre", "", text));
    }
  }
  return nodes;
}

function resultNode(result) {
  const details = element("details");
  const name = state.toolNames.get(result.call_id);
  const summary = element("summary");
  let output = result.output;
  let parsed = null;
  try {
    parsed = JSON.parse(output);
  } catch (_) {
    parsed = null;
  }
  const failed = parsed && parsed.isError === true;
  summary.append(failed ? "Error from " : "Result of ", element("code", "", name || "the tool"));
  details.append(summary);
  // MCP CallToolResult: {"content": [{"type": "text", "text"}, {"type": "image", "data", "mimeType"}]}
  const shown = parsed && Array.isArray(parsed.content) ? contentNodes(parsed.content, name) : null;
  // Not MCP's, or a part nested too deeply to write: the output as it came.
  details.append(...(shown || [element("pre", "", pretty(output ?? ""))]));
  // Open to read, unless long: a page or a file a tool read would push the reply far down.
  details.open = details.textContent.length - summary.textContent.length <= LONG_RESULT;
  return details;
}

function memoriesNode(memories) {
  const details = element("details", "memories");
  const summary = element("summary", "", memories.length === 1 ? "1 memory used" : `${memories.length} memories used`);
  const list = element("ul");
  for (const memory of memories) {
    const text = (memory.content || [])
      .filter((part) => part.type === "text")
      .map((part) => part.text)
      .join(" ");
    list.append(element("li", "", text || "(no text)"));
  }
  details.append(summary, list);
  return details;
}

// In a narrow or short window the page scrolls as a whole (see app.css).
function scroller() {
  const log = $("messages");
  return getComputedStyle(log).overflowY === "visible" ? document.scrollingElement : log;
}

// Whether new text is followed: until the reader scrolls back (a wheel or a touch, a key, the
// scroll bar) to read, where they then stay; and again once they scroll back to the end. Only
// the reader's own moves count: the page's changes of height scroll it too, and the page's own
// scrolls are told apart by where they left the view. Whether the reader reached the end is
// judged against the end as last shown: a reply can grow by many lines between the reader's
// scroll and its event, where a distance from the end as it is now would say they are not.
let following = true;
let pageTop = null; // where the page last scrolled the view to
let shownEnd = Infinity; // the farthest the view could be scrolled in the frame last shown
function readBack() {
  following = false;
}
function noteScroll() {
  const view = scroller();
  if (view.scrollTop === pageTop) return; // the page's own scroll (or the reply growing below)
  pageTop = null;
  const end = Math.min(shownEnd, view.scrollHeight - view.clientHeight);
  if (view.scrollTop >= end - 1) following = true;
}
const BACK_KEYS = new Set(["PageUp", "ArrowUp", "Home"]);
function watchReading() {
  document.addEventListener("wheel", (event) => event.deltaY < 0 && readBack(), { passive: true });
  document.addEventListener("touchmove", readBack, { passive: true });
  document.addEventListener("keydown", (event) => {
    const typing = event.target instanceof HTMLTextAreaElement || event.target instanceof HTMLInputElement;
    if (BACK_KEYS.has(event.key) && !typing) readBack();
  });
  // The scroll bar: a press on the scrolling element itself.
  document.addEventListener("pointerdown", (event) => {
    if (event.target === $("messages") || event.target === document.documentElement) readBack();
  });
  $("messages").addEventListener("scroll", noteScroll, { passive: true });
  window.addEventListener("scroll", noteScroll, { passive: true });
}

// Once per frame at most: reading scrollHeight lays the page out, and a reply can come in
// thousands of pieces. ``always``: the user's own message, or a session just opened.
let scrollPending = false;
function scrollToEnd(always = false) {
  if (always) following = true;
  if (scrollPending) return;
  scrollPending = true;
  requestAnimationFrame(() => {
    scrollPending = false;
    showFrame();
  });
}

// Just before a frame is shown, once its content changed: its end is noted, and kept in view
// while followed.
function showFrame() {
  const view = scroller();
  if (following) {
    view.scrollTop = view.scrollHeight;
    pageTop = view.scrollTop;
  }
  shownEnd = view.scrollHeight - view.clientHeight;
}

// --- Running the agent ----------------------------------------------------------------

async function searchMemories(text) {
  try {
    const response = await api("memory/search", { method: "POST", json: { query: text, top_k: MEMORY_TOP_K } });
    return (await response.json()).items || [];
  } catch (_) {
    return []; // no memory routes on this server, or nothing to search with: show none
  }
}

async function send(event) {
  event.preventDefault();
  const input = $("composer-input");
  if (BLANK.test(input.value) || state.run) return;
  // While a session loads, its history is still being put on screen: a message sent then
  // would land in the middle of it, or be trimmed away with the oldest messages. It goes
  // once the history is there (staying in the box if the session is left meanwhile).
  const loading = state.loading;
  if (loading) {
    await loading.done;
    if (!loading.finished) return;
  }
  // Without the blank lines around it; a pasted snippet's first line keeps its indentation.
  const text = input.value.replace(/^(?:[ \t]*\n)+/, "").trimEnd();
  if (!text || state.run) return;
  input.value = "";
  fitComposer();
  const log = $("messages");
  log.querySelector(".empty")?.remove();
  const user = messageView({ role: "user", type: "message" });
  renderParts(user, [{ type: "text", text }]);
  log.append(user.item);
  scrollToEnd(true);

  const run = { controller: new AbortController(), id: null, stopped: false, text, key: state.key };
  state.run = run;
  setRunning(true, "Thinking…");
  const memories = await searchMemories(text);
  if (state.key !== run.key) {
    // Signed out meanwhile (their key refused): nothing runs, and nothing of theirs goes back
    // in the box for whoever signs in next.
    if (state.run === run) state.run = null;
    setRunning(false, "");
    return;
  }
  if (memories.length) user.item.append(memoriesNode(memories));
  if (run.left) {
    // Another session opened before it was sent: nothing runs, the message waits in the box.
    if (!input.value) input.value = text;
    fitComposer();
    return;
  }
  if (run.stopped) {
    // Stopped before it was sent: nothing runs.
    state.run = null;
    returnToBox(user, text);
    setRunning(false, "Stopped before it was sent.");
    return;
  }

  let refused = null; // the error of a request no run took
  await stream(run, async () => {
    try {
      return await api("process", {
        method: "POST",
        json: {
          input: [{ role: "user", content: [{ type: "text", text }] }],
          session_id: state.session || undefined,
          stream: true,
        },
        signal: run.controller.signal,
        accept: "text/event-stream",
      });
    } catch (error) {
      // Stopped meanwhile or not, no run has it.
      if (error.name !== "AbortError" && error.status !== 401) refused = error;
      throw error;
    }
  });
  if (state.key !== run.key) return; // signed out meanwhile: nothing goes back in the box
  if (refused && run.left) {
    // Refused after another session was opened: the message waits in the box.
    if (!$("composer-input").value) $("composer-input").value = text;
    fitComposer();
  } else if (refused) {
    // Refused, or the server out of reach: no run has it.
    returnToBox(user, text);
    const why = refused.status ? refused.message : "the server cannot be reached";
    $("run-status").textContent = `Error: ${why}. The message was not sent: it is back in the box.`;
  }
}

// A message no run took leaves the conversation and goes back to the box, to be sent again.
function returnToBox(user, text) {
  const log = $("messages");
  user.item.remove();
  if (!log.children.length) log.append(emptyState());
  const input = $("composer-input");
  if (!input.value) input.value = text;
  fitComposer();
}

// Show a run's events as they come, from the response `open` gives, until the run ends. While
// it streams, the tab remembers it, so a reload picks it up again (resumeRun).
async function stream(run, open) {
  const views = new Map();
  let outcome = "";
  try {
    const response = await open();
    run.id = run.id || response.headers.get("X-Run-Id");
    if (run.stopped) {
      // Stopped (then perhaps left) before its id arrived: cancel it now that it is known.
      cancelRun(run);
      throw new DOMException("stopped", "AbortError");
    }
    if (run.left) {
      if (run.id) state.runTexts.set(run.id, run.text);
      run.controller.abort();
      throw new DOMException("left", "AbortError");
    }
    adoptSession(response.headers.get("X-Session-Id"));
    if (run.id && state.session) {
      const saved = { id: run.id, session: state.session, text: run.text };
      sessionStorage.setItem(RUN_STORAGE, JSON.stringify(saved));
    }
    outcome = await follow(response, run, views);
  } catch (error) {
    if (run.stopped || error.name === "AbortError") outcome = "Stopped.";
    else if (error.status !== 401) outcome = `Error: ${error.message}`;
  } finally {
    for (const view of views.values()) setStreaming(view, false);
    if (savedRun()?.id === run.id) sessionStorage.removeItem(RUN_STORAGE);
    if (state.run === run) {
      state.run = null;
      setRunning(false, outcome);
    }
  }
  // Not for one who signed out meanwhile (with no key, or the next one's).
  if (state.key === run.key) loadSessions();
}

// A message being streamed is busy: screen readers announce it once, whole, when it is done,
// rather than again at every piece of text.
function setStreaming(view, streaming) {
  view.item.classList.toggle("streaming", streaming);
  const folded = view.item.querySelector(":scope > details");
  if (folded) folded.open = streaming;
  if (streaming) view.item.setAttribute("aria-busy", "true");
  else view.item.removeAttribute("aria-busy");
}

function savedRun() {
  try {
    return JSON.parse(sessionStorage.getItem(RUN_STORAGE));
  } catch (_) {
    return null;
  }
}

// After a reload: open the session of the run the tab was streaming (which shows the run
// again if it still goes on).
function resumeRun() {
  const saved = savedRun();
  sessionStorage.removeItem(RUN_STORAGE);
  if (!saved || typeof saved.id !== "string" || typeof saved.session !== "string") return;
  if (typeof saved.text === "string") state.runTexts.set(saved.id, saved.text);
  openSession(saved.session);
}

// Show a run of the session on screen that still goes on, from its first event, after the
// message that started it (``text``, when this tab sent it: a run's events do not hold it).
async function followRun(id, text) {
  const log = $("messages");
  log.querySelector(".empty")?.remove();
  if (typeof text === "string") {
    const user = messageView({ role: "user", type: "message" });
    renderParts(user, [{ type: "text", text }]);
    log.append(user.item);
  }
  scrollToEnd();
  const run = { controller: new AbortController(), id, stopped: false, text, key: state.key };
  state.run = run;
  setRunning(true, "Thinking…");
  await stream(run, () =>
    api(`runs/${encodeURIComponent(id)}/events?after=-1`, {
      signal: run.controller.signal,
      accept: "text/event-stream",
    }),
  );
}

// Read a run's stream to its end. A stream cut before the run ended (a dropped connection, a
// proxy's time limit, a buffered Lambda function's size limit) is picked up again after the
// last event received, from the stored run. A stream that brings no new event counts as a
// failed try; one that brings none and ends with the server's error event (an event too large
// for the function to return, however it is asked for) ends the run's stream with that error.
async function follow(response, run, views) {
  let outcome = "";
  let last = -1;
  let ended = false;
  let failures = 0;
  for (;;) {
    let lost = new Error("the connection closed before the run ended");
    let told = null; // the error event the server ended this stream with
    let progressed = false;
    try {
      for await (const data of serverSentEvents(response)) {
        if (run.left) throw new DOMException("left", "AbortError");
        if (Number.isInteger(data.sequence_number) && data.sequence_number > last) {
          last = data.sequence_number;
          progressed = true;
        }
        if (data.object === "response" && TERMINAL.has(data.status)) ended = true;
        if (data.object === undefined && data.error && typeof data.error === "object") {
          const { message = "the server ended the stream", code = "ERROR" } = data.error;
          told = new Error(`${message} (${code})`);
        }
        outcome = handleEvent(data, run, views) || outcome;
      }
    } catch (error) {
      if (run.stopped || error.name === "AbortError") throw error;
      lost = error;
    }
    if (ended) return outcome;
    if (told) {
      // Asked again, the server would answer the same.
      if (!progressed) throw told;
      lost = told;
    }
    if (progressed) failures = 0;
    response = null;
    while (!response) {
      if (!run.id || failures >= RESUME_ATTEMPTS) throw lost;
      $("run-status").textContent = "Connection lost, reconnecting…";
      await pause(500 * 2 ** failures, run.controller.signal);
      failures += 1;
      try {
        response = await api(`runs/${encodeURIComponent(run.id)}/events?after=${last}`, {
          signal: run.controller.signal,
          accept: "text/event-stream",
        });
      } catch (error) {
        if (error.status === 401 || run.stopped || error.name === "AbortError") throw error;
        // The server does not have the run (no runs store, or another server's memory): give up.
        // Busy for a moment (a store that did not answer, a function throttled): try again.
        if (error instanceof ApiError && !busy(error.status)) throw lost;
      }
    }
    $("run-status").textContent = "Thinking…";
  }
}

// Whether a server answering ``status`` may answer otherwise when asked again a moment later.
function busy(status) {
  return status === 429 || (status >= 500 && status !== 501);
}

function pause(milliseconds, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, milliseconds);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        reject(new DOMException("stopped", "AbortError"));
      },
      { once: true },
    );
  });
}

function adoptSession(id) {
  if (id && id !== state.session) {
    state.session = id;
    markCurrentSession();
  }
}

function handleEvent(data, run, views) {
  const log = $("messages");
  if (data.object === "response") {
    if (data.id && !run.id) run.id = data.id;
    adoptSession(data.session_id);
    if (data.status === "completed") return usageText(data.usage);
    return showRunEnd(data.status, data.error);
  }
  if (data.object === "message") {
    let view = views.get(data.id);
    if (!view) {
      view = messageView(data);
      setStreaming(view, true);
      views.set(data.id, view);
      log.append(view.item);
    }
    if (TERMINAL.has(data.status)) {
      if (Array.isArray(data.content) && data.content.length) renderParts(view, data.content);
      setStreaming(view, false);
    }
    scrollToEnd();
    return "";
  }
  if (data.object === "content") {
    const view = views.get(data.msg_id);
    if (!view) return "";
    const index = Number.isInteger(data.index) ? data.index : view.parts.length;
    const node = view.parts[index];
    if (data.delta && data.type === "text" && node?.matches(".text:not(.refusal)")) {
      appendStreamedText(node, data.text || "");
    } else if (data.delta && data.type === "refusal" && node?.classList.contains("refusal")) {
      appendStreamedText(node, data.refusal || ""); // the refusal streamed so far, and this piece
    } else {
      setPart(view, index, data);
    }
    scrollToEnd();
  }
  return "";
}

// The end of a run that gave no reply, in the conversation (a failure) and as the run's status.
function showRunEnd(status, error) {
  if (status === "failed") {
    const failure = messageView({ role: "assistant", type: "message" });
    failure.item.classList.add("failed");
    const message = (error && error.message) || "unknown error";
    // Plain text: an error's message is no markdown of the agent's (its URLs no links).
    failure.body.append(element("span", "text", `The agent failed: ${message}`));
    $("messages").append(failure.item);
    scrollToEnd();
    return "The run failed.";
  }
  if (status === "canceled") return "Stopped.";
  if (status === "incomplete") return "The run ended before its reply was done.";
  return "";
}

function usageText(usage) {
  if (!usage || typeof usage.total_tokens !== "number") return "Done.";
  return `Done · ${usage.prompt_tokens ?? "?"} prompt + ${usage.completion_tokens ?? "?"} completion = ${usage.total_tokens} tokens`;
}

function setRunning(running, status) {
  $("send").hidden = running;
  $("stop").hidden = !running;
  $("run-status").textContent = status;
  // Focus stays in the message box, never on Stop: typing on, or a second Enter, would stop
  // the run. Escape stops it from anywhere. The box is always in view: focusing it scrolls
  // nothing (which would take the reader away from where they read).
  $("composer-input").focus({ preventScroll: true });
}

// Leave the run being streamed (another session opened, or a new chat): the page stops reading
// it, the run goes on. Its session, opened again, shows it going on, or as stored once ended.
function leaveRun() {
  const run = state.run;
  if (!run) return;
  run.left = true;
  if (run.id) state.runTexts.set(run.id, run.text);
  // One not named yet is left once its id arrives (stream): the run goes on all the same,
  // and its message is kept for its session opened again. One stopped is canceled then.
  if (run.id) run.controller.abort();
  state.run = null;
  setRunning(false, "");
}

function stopRun() {
  const run = state.run;
  if (!run) return;
  run.stopped = true;
  // Before the response names the run, leaving would not stop it (a run goes on when its
  // client leaves): the run is canceled once its id arrives (stream), then left.
  if (run.id) cancelRun(run);
  else setRunning(true, "Stopping…");
}

function cancelRun(run) {
  run.controller.abort();
  if (!run.id) return;
  // Tell the server too, with the key of its user (who may have signed out since); a server
  // without the runs routes answers 404, which is fine.
  fetch(`runs/${encodeURIComponent(run.id)}/cancel`, {
    method: "POST",
    headers: { Authorization: `Bearer ${run.key}` },
    credentials: "omit",
  }).catch(() => {});
}

// The message box grows with its text (up to a part of the window, see app.css), so a pasted
// or long message is seen whole before it is sent.
function fitComposer() {
  const input = $("composer-input");
  input.style.height = "";
  // Empty, it keeps its size: its placeholder, wrapped in a narrow window, would grow it.
  if (input.value && input.scrollHeight > input.clientHeight) {
    input.style.height = `${input.scrollHeight + input.offsetHeight - input.clientHeight}px`;
  }
  scrollToEnd(); // a conversation followed keeps its end in view above the box
}

// Whether a key goes to an input method (Japanese, Chinese...) as it puts a word together: its
// Enter picks the word, its Escape drops it. Safari says so with keyCode 229, not isComposing.
function composing(event) {
  return event.isComposing || event.keyCode === 229;
}

// --- Wiring ---------------------------------------------------------------------------

function start() {
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut());
  $("new-chat").addEventListener("click", () => {
    newChat();
    $("composer-input").focus();
  });
  $("composer").addEventListener("submit", send);
  $("stop").addEventListener("click", stopRun);
  $("composer-input").addEventListener("input", fitComposer);
  $("composer-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !composing(event)) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  watchReading();
  window.addEventListener("online", () => {
    if (state.key && state.sessionsRetry.timer) loadSessions(); // a retry is waiting
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && state.run && !composing(event)) stopRun();
  });
  if (state.key) showChat();
  else $("api-key").focus();
}

start();

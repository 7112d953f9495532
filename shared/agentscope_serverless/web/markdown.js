// Markdown in the agent's replies, built as DOM nodes, never parsed as HTML: paragraphs and
// line breaks, headings, lists, quotes, rules, fenced code, tables, inline code, bold,
// italic and links (http, https and mailto only; bare http(s) URLs too). Anything else,
// HTML included, stays text.

// Patterns with one way to match a line: none backtracks over a long one.
const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t](.*))?$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;
// Spans are bounded (1,000 characters, links 2,000): what a start looks for is never the
// rest of a long text, so no reply makes the page work quadratically.
const INLINE = new RegExp(
  [
    /(`{1,16})([^`]|[^`][\s\S]{0,998}?[^`])\1(?!`)/.source, // 1, 2: code
    /\[([^\]\n]{1,1000})\]\(([^()\s]{1,2000})\)/.source, // 3, 4: link
    /\*\*(?=\S)([\s\S]{0,998}?\S)\*\*/.source, // 5: bold
    /(?<!\w)__(?=\S)([\s\S]{0,998}?\S)__(?!\w)/.source, // 6: bold
    /(?<![\w*])\*(?=[^\s*])([^*\n]{0,998}?[^\s*])\*(?![\w*])/.source, // 7: italic
    /(?<![\w_])_(?=[^\s_])([^_\n]{0,998}?[^\s_])_(?![\w_])/.source, // 8: italic
    /(https?:\/\/[^\s<>()]{0,2000}[^\s<>().,;:!?'"`*_])/.source, // 9: a bare URL
  ].join("|"),
  "g",
);
// Quotes and lists nest this deep at most; deeper, their markers are text.
const MAX_DEPTH = 8;

function node(tag, text) {
  const made = document.createElement(tag);
  if (text !== undefined) made.textContent = text;
  return made;
}

// The fence opening a code block on ``line``, with its info (a backtick fence's holds none).
function fence(line) {
  const match = FENCE.exec(line);
  if (!match || (match[1][0] === "`" && match[2].includes("`"))) return null;
  return { marker: match[1], language: match[2].trim().split(/\s/)[0] };
}

// A heading's text: without the closing #s some write after it.
function headingText(text) {
  const words = (text || "").trim().split(/\s+/);
  if (words.length > 1 && /^#+$/.test(words.at(-1))) words.pop();
  return words.length === 1 && /^#+$/.test(words[0]) ? "" : words.join(" ");
}

function startsBlock(line, depth) {
  const nests = depth < MAX_DEPTH && (QUOTE.test(line) || ITEM.test(line));
  return nests || fence(line) !== null || HEADING.test(line) || RULE.test(line);
}

function link(text, href) {
  if (!/^(https?:\/\/|mailto:)/i.test(href)) return null;
  const anchor = node("a");
  anchor.href = href;
  anchor.rel = "noopener noreferrer";
  anchor.target = "_blank";
  anchor.append(inline(text, false));
  return anchor;
}

// The inline markup of one block's text, as a fragment (``links``: false inside a link).
export function inline(text, links = true) {
  const out = document.createDocumentFragment();
  let at = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > at) out.append(text.slice(at, match.index));
    const [whole, , code, label, href, bold, bold2, italic, italic2, url] = match;
    let made = null;
    if (code !== undefined) made = node("code", code);
    else if (label !== undefined) made = links ? link(label, href) : null;
    else if (bold !== undefined || bold2 !== undefined) made = node("strong");
    else if (italic !== undefined || italic2 !== undefined) made = node("em");
    else if (url !== undefined) made = links ? link(url, url) : null;
    if (made && (made.tagName === "STRONG" || made.tagName === "EM")) {
      made.append(inline(bold ?? bold2 ?? italic ?? italic2, links));
    }
    out.append(made || whole);
    at = match.index + whole.length;
  }
  if (at < text.length) out.append(text.slice(at));
  return out;
}

// Lines as text with a <br> between them.
function lines(parent, texts) {
  texts.forEach((text, index) => {
    if (index) parent.append(node("br"));
    parent.append(inline(text));
  });
  return parent;
}

function cells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function table(header, rows) {
  const made = node("table");
  const head = node("thead");
  const top = node("tr");
  for (const cell of cells(header)) top.append(lines(node("th"), [cell]));
  head.append(top);
  const body = node("tbody");
  for (const row of rows) {
    const line = node("tr");
    for (const cell of cells(row)) line.append(lines(node("td"), [cell]));
    body.append(line);
  }
  made.append(head, body);
  const wrapper = node("div");
  wrapper.className = "table";
  wrapper.append(made);
  return wrapper;
}

// The list starting at lines[start]: [its element, the line after it].
function list(all, start, depth) {
  const first = ITEM.exec(all[start]);
  const ordered = /\d/.test(first[2]);
  const made = node(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) made.start = parseInt(first[2], 10);
  let i = start;
  while (i < all.length) {
    const item = ITEM.exec(all[i]);
    if (!item || /\d/.test(item[2]) !== ordered) break;
    const body = [item[3]];
    i += 1;
    // What follows, indented (a nested list, a second line), belongs to the item.
    while (i < all.length && /^\s{2,}\S/.test(all[i])) {
      body.push(all[i].replace(/^\s{2,4}/, ""));
      i += 1;
    }
    const entry = node("li");
    if (body.length === 1) entry.append(inline(body[0]));
    else entry.append(markdown(body.join("\n"), true, depth + 1));
    made.append(entry);
    // A blank line between items keeps the list going.
    if (i + 1 < all.length && all[i] !== undefined && !all[i].trim() && ITEM.test(all[i + 1])) i += 1;
  }
  return [made, i];
}

// ``text`` as a fragment of block elements; ``tight`` (a list item's): paragraphs come as
// their lines, without a paragraph of their own.
export function markdown(text, tight = false, depth = 0) {
  const all = String(text).replace(/\r\n?/g, "\n").split("\n");
  const out = document.createDocumentFragment();
  let i = 0;
  while (i < all.length) {
    const line = all[i];
    let match;
    if (!line.trim()) {
      i += 1;
    } else if ((match = fence(line))) {
      const close = new RegExp(`^ {0,3}${match.marker[0] === "`" ? "`" : "~"}{${match.marker.length},}[ \\t]*$`);
      const body = [];
      for (i += 1; i < all.length && !close.test(all[i]); i += 1) body.push(all[i]);
      i += 1;
      const code = node("code", body.join("\n"));
      if (match.language) code.dataset.language = match.language;
      const pre = node("pre");
      pre.append(code);
      out.append(pre);
    } else if ((match = HEADING.exec(line))) {
      const heading = node("p");
      heading.className = `heading level-${match[1].length}`;
      heading.append(inline(headingText(match[2])));
      out.append(heading);
      i += 1;
    } else if (RULE.test(line)) {
      out.append(node("hr"));
      i += 1;
    } else if (QUOTE.test(line) && depth < MAX_DEPTH) {
      const body = [];
      for (; i < all.length && QUOTE.test(all[i]); i += 1) body.push(all[i].replace(QUOTE, ""));
      const quote = node("blockquote");
      quote.append(markdown(body.join("\n"), false, depth + 1));
      out.append(quote);
    } else if (ITEM.test(line) && depth < MAX_DEPTH) {
      const [made, next] = list(all, i, depth);
      out.append(made);
      i = next;
    } else if (line.includes("|") && i + 1 < all.length && TABLE_RULE.test(all[i + 1])) {
      const rows = [];
      for (i += 2; i < all.length && all[i].includes("|") && all[i].trim(); i += 1) rows.push(all[i]);
      out.append(table(line, rows));
    } else {
      const body = [];
      for (; i < all.length && all[i].trim() && (!body.length || !startsBlock(all[i], depth)); i += 1) {
        body.push(all[i]);
      }
      if (tight) lines(out, body);
      else out.append(lines(node("p"), body));
    }
  }
  return out;
}

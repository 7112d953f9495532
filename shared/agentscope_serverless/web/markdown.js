// Markdown in the agent's replies, built as DOM nodes, never parsed as HTML: paragraphs and
// line breaks, headings, lists, quotes, rules, fenced code, tables, inline code, bold,
// italic, strikethrough and links (http, https and mailto only; bare http(s) URLs too),
// punctuation a backslash escapes. Anything else, HTML included, stays text.

// Patterns with one way to match a line: none backtracks over a long one.
const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t](.*))?$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
// The line under a paragraph that makes it a heading: "=" for the first level, "-" for the
// second (two or more: one "-" may be a list item being written).
const UNDERLINE = /^ {0,3}(=+|-{2,})[ \t]*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])\s+(.*)$/;
// Of a line trimmed: no two runs of spaces side by side, which would try every split of a
// long one between them.
const TABLE_RULE = /^\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?$/;
// Where a span may open: code, a link, bold, italic or struck through, a URL (bare or in <>);
// or a backslash escapes the punctuation after it, shown as it is.
const SPAN_START = /[`[*_]|~~|<?https?:\/\/|\\[!-\/:-@[-`{-~]/g;
// What ends a span, searched for from its start (see ``closers``).
const CLOSER = {
  label: /[[\]\n]/g, // a link's text opens at the last "[" before its "]"
  bold: /(?<=\S)\*\*/g,
  bold2: /(?<=\S)__(?!\w)/g,
  struck: /(?<=\S)~~/g,
  italic: /[*\n]/g, // italic text holds no "*"
  italic2: /[_\n]/g,
  url: /[\s<>]/g,
};
// A link's address, its title if any (in double or single quotes, after a space) and its ")":
// the address may hold parentheses, one level deep (Wikipedia's "Python_(programming_language)").
const HREF = /((?:[^()\s]|\([^()\s]*\))+)(?:[ \t]+(?:"([^"\n]*)"|'([^'\n]*)'))?[ \t]*\)/y;
const URL_TAIL = /[.,;:!?'"`*_]/; // ends the sentence rather than a bare URL
// Quotes, lists and spans nest this deep at most; deeper, their markers are text.
const MAX_DEPTH = 8;

function node(tag, text) {
  const made = document.createElement(tag);
  if (text !== undefined) made.textContent = text;
  return made;
}

// A block of text (a paragraph, a list item, a quote, a table cell), set right to left when it
// starts in a script written so (Hebrew, Arabic...), whatever the reply's other blocks are
// written in. Set so once it holds its text: the browser works the direction out again at each
// node put into a block set so, which for a paragraph of thousands took seconds.
function directed(block) {
  block.dir = "auto";
  return block;
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

function link(text, href, depth, title) {
  if (!/^(https?:\/\/|mailto:)/i.test(href)) return null;
  const anchor = node("a");
  anchor.href = href;
  if (title) anchor.title = title;
  anchor.rel = "noopener noreferrer";
  anchor.target = "_blank";
  anchor.append(inline(text, false, depth + 1));
  return anchor;
}

function span(tag, text, links, depth) {
  const made = node(tag);
  made.append(inline(text, links, depth + 1));
  return made;
}

const word = (char) => char !== undefined && /\w/.test(char);
const solid = (char) => char !== undefined && !/\s/.test(char);

// Where each run of backticks is closed: by the next run as long ("``a`b``").
function codeRuns(text) {
  const runs = [...text.matchAll(/`+/g)];
  const closes = new Map(); // a run's start -> [its length, the start of its closing run]
  const next = new Map(); // a length -> the start of the nearest run of it further on
  for (const { index, 0: run } of runs.reverse()) {
    closes.set(index, [run.length, next.get(run.length)]);
    next.set(run.length, index);
  }
  return closes;
}

// Whether the character at ``at`` follows a backslash that escapes it (not an escaped one).
function escaped(text, at) {
  let backslashes = 0;
  while (text[at - 1 - backslashes] === "\\") backslashes += 1;
  return backslashes % 2 === 1;
}

// The closers of ``text``: closer(kind, from) is where the first of ``kind`` at ``from`` or
// after starts (text.length if none). ``from`` only grows, for each kind: what a search
// found ahead serves the next ones, so no part of the text is searched twice for a kind.
function closers(text) {
  const found = {};
  let runs = null;
  const closer = (kind, from) => {
    if (!(found[kind] >= from)) {
      const pattern = CLOSER[kind];
      pattern.lastIndex = from;
      let match;
      // Not a closer a backslash escapes ("\*"), but in an address.
      while ((match = pattern.exec(text)) && kind !== "url" && escaped(text, match.index)) {
        pattern.lastIndex = match.index + 1;
      }
      found[kind] = match?.index ?? text.length;
    }
    return found[kind];
  };
  closer.code = (at) => (runs ??= codeRuns(text)).get(at) ?? [1, undefined];
  return closer;
}

// The span opening at ``at``: [where it ends, its node, or null to show it as text], or
// [undefined, how far to skip] when nothing opens there.
function spanAt(text, at, closer, links, depth) {
  const [char, after, before] = [text[at], text[at + 1], text[at - 1]];
  if (char === "\\") return [at + 2, after];
  if (char === "`") {
    const [length, close] = closer.code(at);
    if (close === undefined) return [undefined, length];
    return [close + length, node("code", text.slice(at + length, close))];
  }
  if (char === "[") {
    const close = closer("label", at + 1);
    HREF.lastIndex = close + 2;
    const target = text[close] === "]" && close > at + 1 && text[close + 1] === "(" && HREF.exec(text);
    if (target) {
      const [, href, title = target[3]] = target;
      const made = links ? link(text.slice(at + 1, close), href, depth, title) : null;
      return [HREF.lastIndex, made];
    }
  } else if (char === "*" && after === "*" && solid(text[at + 2])) {
    let close = closer("bold", at + 3);
    // "***" after text holding a "*" closes an italic in it, then the bold ("***both***").
    if (text[close + 2] === "*" && text.slice(at + 2, close).includes("*")) close += 1;
    if (close < text.length) return [close + 2, span("strong", text.slice(at + 2, close), links, depth)];
  } else if (char === "_" && after === "_" && !word(before) && solid(text[at + 2])) {
    const close = closer("bold2", at + 3);
    if (close < text.length) return [close + 2, span("strong", text.slice(at + 2, close), links, depth)];
  } else if (char === "~" && solid(text[at + 2])) {
    const close = closer("struck", at + 3);
    if (close < text.length) return [close + 2, span("del", text.slice(at + 2, close), links, depth)];
  } else if (char === "<") {
    // A URL in angle brackets, shown without them.
    const end = closer("url", at + 1);
    if (text[end] === ">") {
      const url = text.slice(at + 1, end);
      return [end + 1, links ? link(url, url, depth) : null];
    }
  } else if (char === "h") {
    const start = at + (text.startsWith("https", at) ? 8 : 7);
    let end = closer("url", start);
    // Without the punctuation after it, nor a ")" closing none of its own "(" (as in "(see
    // https://...)", where Wikipedia's ".../Python_(programming_language)" keeps its own).
    let unclosed = 0;
    for (let i = at; i < end; i += 1) unclosed += text[i] === ")" ? 1 : text[i] === "(" ? -1 : 0;
    while (end > start && (URL_TAIL.test(text[end - 1]) || (text[end - 1] === ")" && unclosed > 0))) {
      if (text[end - 1] === ")") unclosed -= 1;
      end -= 1;
    }
    if (end > start) return [end, links ? link(text.slice(at, end), text.slice(at, end), depth) : null];
  }
  // One "*" or "_" around text holding none: italic.
  if ((char === "*" || char === "_") && !word(before) && before !== char && solid(after) && after !== char) {
    const close = closer(char === "*" ? "italic" : "italic2", at + 1);
    if (text[close] === char && solid(text[close - 1]) && !word(text[close + 1]) && text[close + 1] !== char) {
      return [close + 1, span("em", text.slice(at + 1, close), links, depth)];
    }
  }
  return [undefined, 1];
}

// The inline markup of one block's text, as a fragment (``links``: false inside a link). One
// pass: each span's closer is found by a search that only moves forward (closers), so any
// text, 20,000 "[" or "**" that never close included, takes a time in proportion to its length.
export function inline(text, links = true, depth = 0) {
  const out = document.createDocumentFragment();
  let shown = 0; // what comes before is in ``out``
  let at = 0;
  const closer = closers(text);
  while (depth <= MAX_DEPTH) {
    SPAN_START.lastIndex = at;
    const start = SPAN_START.exec(text);
    if (!start) break;
    const [end, made] = spanAt(text, start.index, closer, links, depth);
    if (end === undefined) {
      at = start.index + made;
      continue;
    }
    if (start.index > shown) out.append(text.slice(shown, start.index));
    out.append(made || text.slice(start.index, end));
    shown = at = end;
  }
  if (shown < text.length) out.append(text.slice(shown));
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

// Whether ``line`` heads a table: the line under it (``next``) is a rule with as many cells.
function headsTable(line, next) {
  if (!line.includes("|") || next === undefined || !TABLE_RULE.test(next.trim())) return false;
  return cells(line).length === cells(next).length;
}

// A column's alignment, from its cell in the rule under the header (":---:" centred).
function alignment(rule) {
  const [left, right] = [rule.startsWith(":"), rule.endsWith(":")];
  return left && right ? "center" : right ? "right" : left ? "left" : "";
}

function table(header, rule, rows) {
  const aligned = cells(rule).map(alignment);
  const row = (tag, line) => {
    const made = node("tr");
    cells(line).forEach((cell, column) => {
      const shown = directed(lines(node(tag), [cell]));
      if (aligned[column]) shown.className = `align-${aligned[column]}`;
      made.append(shown);
    });
    return made;
  };
  const made = node("table");
  const head = node("thead");
  head.append(row("th", header));
  const body = node("tbody");
  body.append(...rows.map((line) => row("td", line)));
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
    const indent = all[i].length - item[3].length; // where the item's text starts
    i += 1;
    // What follows, indented (a nested list, a second line or paragraph, code), belongs to the
    // item, with the blank lines before it: taken in as far as the item's text starts, no
    // further (code in it keeps its indentation).
    for (let next = i; next < all.length; next += 1) {
      if (!all[next].trim()) continue;
      if (!/^\s{2,}\S/.test(all[next])) break;
      for (; i < next; i += 1) body.push("");
      body.push(all[i].slice(Math.min(indent, all[i].search(/\S/))));
      i += 1;
    }
    const entry = node("li");
    if (body.length === 1) entry.append(inline(body[0]));
    else entry.append(markdown(body.join("\n"), !body.includes(""), depth + 1));
    made.append(directed(entry));
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
      // Its lines, taken in as far as the fence is indented, no further.
      const indent = line.search(/\S/);
      const body = [];
      for (i += 1; i < all.length && !close.test(all[i]); i += 1) {
        body.push(all[i].slice(Math.min(indent, all[i].search(/[^ ]|$/))));
      }
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
      out.append(directed(heading));
      i += 1;
    } else if (RULE.test(line)) {
      out.append(node("hr"));
      i += 1;
    } else if (QUOTE.test(line) && depth < MAX_DEPTH) {
      const body = [];
      for (; i < all.length && QUOTE.test(all[i]); i += 1) body.push(all[i].replace(QUOTE, ""));
      const quote = node("blockquote");
      quote.append(markdown(body.join("\n"), false, depth + 1));
      out.append(directed(quote));
    } else if (ITEM.test(line) && depth < MAX_DEPTH) {
      const [made, next] = list(all, i, depth);
      out.append(made);
      i = next;
    } else if (headsTable(line, all[i + 1])) {
      const [rule, rows] = [all[i + 1], []];
      for (i += 2; i < all.length && all[i].includes("|") && all[i].trim(); i += 1) rows.push(all[i]);
      out.append(table(line, rule, rows));
    } else {
      const body = [];
      let underline = null;
      for (; i < all.length && all[i].trim(); i += 1) {
        if (body.length && (underline = UNDERLINE.exec(all[i]))) break;
        if (body.length && startsBlock(all[i], depth)) break;
        body.push(all[i]);
      }
      if (underline) {
        const heading = node("p");
        heading.className = `heading level-${underline[1][0] === "=" ? 1 : 2}`;
        heading.append(inline(body.map((text) => text.trim()).join(" ")));
        out.append(directed(heading));
        i += 1;
      } else if (tight) lines(out, body);
      else out.append(directed(lines(node("p"), body)));
    }
  }
  return out;
}

// A small Markdown renderer for replies: fenced code blocks (with a tiny keyword highlighter),
// headings, lists, block quotes, paragraphs; inline code, bold, italic and links. It returns an
// HTML string in which every piece of the input text has been escaped, so the caller may assign
// it to innerHTML: the model's text never becomes markup of its own.

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

const KEYWORDS = new Set((
  'if else elif for while do switch case break continue return function def class struct enum ' +
  'import from export as const let var new delete try catch except finally throw raise yield await async ' +
  'public private protected static virtual override template typename namespace using auto void int char ' +
  'bool float double long unsigned signed true false null nullptr None True False this self in is not and or ' +
  'fn mut impl trait pub use mod match loop where type interface extends implements package go func defer'
).split(' '));
const HASH_COMMENTS = /^(py|python|sh|bash|shell|zsh|ruby|rb|yaml|yml|toml|r|perl|dockerfile|make|makefile)$/i;

// Code as highlighted HTML: comments, strings, numbers and keywords wrapped in spans, every
// token escaped.
export function highlight(code, lang) {
  const comment = HASH_COMMENTS.test(lang) ? '#[^\\n]*' : '\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?\\*\\/';
  const token = new RegExp(
    `(${comment})|("(?:\\\\.|[^"\\\\\\n])*"|'(?:\\\\.|[^'\\\\\\n])*'|\`(?:\\\\.|[^\`\\\\])*\`)` +
    '|(\\b\\d+(?:\\.\\d+)?\\b)|([A-Za-z_]\\w*)', 'g');
  let out = '', last = 0;
  for (const m of code.matchAll(token)) {
    out += escapeHtml(code.slice(last, m.index));
    const text = escapeHtml(m[0]);
    if (m[1]) out += `<span class="hl-com">${text}</span>`;
    else if (m[2]) out += `<span class="hl-str">${text}</span>`;
    else if (m[3]) out += `<span class="hl-num">${text}</span>`;
    else out += KEYWORDS.has(m[4]) ? `<span class="hl-kw">${text}</span>` : text;
    last = m.index + m[0].length;
  }
  return out + escapeHtml(code.slice(last));
}

// A link's target is kept only when it is a web, mail or same-page address (no javascript:).
function safeHref(url) {
  return /^(https?:|mailto:|\/|#)/i.test(url) ? url : null;
}

// Inline markup of one block's text: code spans first (their text is literal), then bold,
// italic and links over the escaped rest.
export function renderInline(text) {
  let out = '';
  const parts = text.split(/(`[^`\n]+`)/);
  for (let i = 0; i < parts.length; ++i) {
    if (i % 2 === 1) {
      out += `<code>${escapeHtml(parts[i].slice(1, -1))}</code>`;
      continue;
    }
    out += escapeHtml(parts[i])
      .replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (whole, label, url) => {
        // url is already escaped: quotes are entities, so it cannot leave the attribute.
        const href = safeHref(url);
        return href ? `<a href="${href}" target="_blank" rel="noopener noreferrer">${label}</a>` : whole;
      })
      .replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>')
      .replace(/(^|[^*\w])\*([^*\n]+)\*(?![*\w])/g, '$1<em>$2</em>')
      .replace(/(^|[^_\w])_([^_\n]+)_(?![_\w])/g, '$1<em>$2</em>');
  }
  return out.replace(/\n/g, '<br>');
}

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const ITEM = /^\s*([-*+]|\d+[.)])\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;

// Markdown text as escaped HTML. An unclosed code fence (a reply still streaming) runs to the end.
export function renderMarkdown(text) {
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let html = '', i = 0;
  const startsBlock = (line) => FENCE.test(line) || HEADING.test(line) || QUOTE.test(line) || ITEM.test(line) || RULE.test(line);
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const code = [];
      for (++i; i < lines.length && !lines[i].trim().startsWith(m[1]); ++i) code.push(lines[i]);
      ++i;  // the closing fence
      const lang = m[2] || '';
      html += `<pre><code${lang ? ` data-lang="${escapeHtml(lang)}"` : ''}>${highlight(code.join('\n'), lang)}</code></pre>`;
    } else if ((m = HEADING.exec(line))) {
      html += `<h${m[1].length}>${renderInline(m[2])}</h${m[1].length}>`;
      ++i;
    } else if (RULE.test(line)) {
      html += '<hr>';
      ++i;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < lines.length && (m = QUOTE.exec(lines[i])); ++i) quoted.push(m[1]);
      html += `<blockquote>${renderMarkdown(quoted.join('\n'))}</blockquote>`;
    } else if ((m = ITEM.exec(line))) {
      const ordered = /\d/.test(m[1]);
      const items = [];
      for (; i < lines.length && (m = ITEM.exec(lines[i])); ++i) items.push(`<li>${renderInline(m[2])}</li>`);
      html += ordered ? `<ol>${items.join('')}</ol>` : `<ul>${items.join('')}</ul>`;
    } else if (line.trim() === '') {
      ++i;
    } else {
      const para = [];
      for (; i < lines.length && lines[i].trim() !== '' && (para.length === 0 || !startsBlock(lines[i])); ++i) para.push(lines[i]);
      html += `<p>${renderInline(para.join('\n'))}</p>`;
    }
  }
  return html;
}

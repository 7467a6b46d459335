// Every table of a page that labsupport.glue.table did not make (a Styler or a DataFrame a cell
// displayed, a table written in the prose) gets what glue.table gives its own: each cell names its
// column (data-label) and the table the class book-table, so that book.css shows it with tight
// cells on a wide screen and as one card per row on a phone. A table whose rows do not match its
// one row of headers is left as it is (it scrolls in its own box).
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".bd-article table:not(.book-table)").forEach(function (table) {
    const heads = table.querySelectorAll("thead tr");
    if (heads.length !== 1) return;
    const names = Array.from(heads[0].children).map(function (th) { return th.textContent.trim(); });
    const rows = Array.from(table.querySelectorAll("tbody tr"));
    if (!rows.length || rows.some(function (tr) { return tr.children.length !== names.length; })) return;
    rows.forEach(function (tr) {
      Array.from(tr.children).forEach(function (cell, i) {
        if (!cell.hasAttribute("data-label")) cell.setAttribute("data-label", names[i]);
      });
    });
    table.classList.add("book-table");
  });
});

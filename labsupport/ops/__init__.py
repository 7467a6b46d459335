"""Operations: live and nightly runs, validation, drift, history, status, notebook parameters and the book build."""

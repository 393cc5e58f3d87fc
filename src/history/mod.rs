//! The indexed execution history: sync points, instruction numbers and a cursor that walks both ways.

-- A record's vector as float32 bytes, little-endian (`contracts.stored_vectors.float32_wire`),
-- beside its JSON: written by the ingest API from the values it validated, shipped by the
-- relay in the `orrery-vector-f32` header, read by the projector instead of the vector's
-- decimals (issue 24: the 384 floats were parsed twice, ~20-27 us each time). NULL for
-- rows written before (their events are published without the header and decoded as
-- before), for records without a vector and for tombstones. Adding a nullable column
-- without a default is a catalog change: instant with rows in the table; roles from
-- before it keep working (they neither write nor read it).
-- EXTERNAL: never compressed (float32 values do not compress; lz4 would try on every
-- row); moved out of line only when the row is still over the TOAST threshold.
ALTER TABLE records ADD COLUMN vector_f32 bytea;
ALTER TABLE records ALTER COLUMN vector_f32 SET STORAGE EXTERNAL;

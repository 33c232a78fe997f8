-- Run once by the postgres image on an empty data directory: the GPU ledger gets its own
-- database and role beside Airflow's metadata database (task code may not use Airflow's).
CREATE ROLE gpupool LOGIN PASSWORD 'gpupool';
CREATE DATABASE gpupool OWNER gpupool;
